//! Strata's compiled core: what a reader does with block bytes, done outside the
//! interpreter's lock.
//!
//! A short-circuit reader reads ranges of a block file the worker handed it and checks each
//! chunk against the block's CRC-32C checksums (`BlockFile`); a data-port reader sends a
//! request, takes the reply line and receives the payload (`exchange`, `exchange_fds`,
//! `receive_checked`). In Python each system call and each check gives up the lock and takes
//! it back, and a thread that wants it back while the reader is busy in Python waits up to
//! the switch interval (5 ms) each time: the reads ahead of a reader ran only when it blocked.
//! Here each of those is one call that lets go of the lock once, and a sequential reader's
//! next range is read and checked in a thread of its own while the reader works on this one.

use std::fs::File;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Ranges at least this long are read and checked by two threads, half each.
const SPLIT_AT: usize = 4 << 20;
/// Bytes read (one pread) and then checked at a time: small enough to be checked while in
/// the core's cache (L2), large enough that the calls cost little (4,096 a GiB).
const PIECE: usize = 256 << 10;

/// The CRC-32C (Castagnoli, "CRC-32/ISCSI") of `bytes`, as the workers compute a chunk's.
/// crc-fast folds with carry-less multiplies (VPCLMULQDQ where the CPU has it): twice the
/// crc32 instruction's speed here, and the check was 7% of a warm Parquet scan's CPU.
fn crc32c(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// What a block file holds and how its chunks are checked; shared with the read-ahead thread.
struct Block {
    file: File,
    length: u64,
    checksums: Vec<u32>,
    chunk: u64,
}

impl Block {
    /// Fill `out` from the file at `start` (a chunk boundary) and check every chunk of it;
    /// false when the file ends first or a chunk fails its checksum. Read and checked a
    /// piece at a time, so the check finds each piece still in the core's cache.
    fn fill_checked(&self, out: &mut [u8], start: u64) -> bool {
        let piece = (PIECE as u64).div_ceil(self.chunk).max(1) * self.chunk;
        let first = (start / self.chunk) as usize;
        let per_piece = (piece / self.chunk) as usize;
        out.chunks_mut(piece as usize).enumerate().all(|(p, part)| {
            let at = start + p as u64 * piece;
            self.fill(part, at)
                && part.chunks(self.chunk as usize).enumerate().all(|(i, bytes)| {
                    let index = first + p * per_piece + i;
                    self.checksums.get(index).is_some_and(|&sum| crc32c(bytes) == sum)
                })
        })
    }

    /// Fill `out` from the file at `at`; false when the file ends first or cannot be read.
    fn fill(&self, out: &mut [u8], at: u64) -> bool {
        let mut got = 0;
        while got < out.len() {
            match self.file.read_at(&mut out[got..], at + got as u64) {
                Ok(0) => return false,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => return false,
            }
        }
        true
    }

    /// `fill_checked`, by two threads when the range is long (each half on a chunk boundary).
    fn fill_checked_split(&self, out: &mut [u8], start: u64) -> bool {
        if out.len() < SPLIT_AT {
            return self.fill_checked(out, start);
        }
        let chunk = self.chunk as usize;
        let half = out.len() / 2 / chunk * chunk;
        let (front, back) = out.split_at_mut(half);
        std::thread::scope(|scope| {
            let other = scope.spawn(|| self.fill_checked(back, start + half as u64));
            let mine = self.fill_checked(front, start);
            other.join().unwrap_or(false) && mine
        })
    }

    /// Why [start, stop) is not a range this block can be read in, if it is not one: it must
    /// start on a chunk boundary and end on one or at the block's end.
    fn check_span(&self, start: u64, stop: u64) -> PyResult<()> {
        if start > stop || stop > self.length {
            return Err(PyValueError::new_err(format!(
                "range [{start}, {stop}) is not within the block's {} bytes",
                self.length
            )));
        }
        if start % self.chunk != 0 || (stop % self.chunk != 0 && stop != self.length) {
            return Err(PyValueError::new_err(format!(
                "range [{start}, {stop}) does not lie on {}-byte chunk boundaries",
                self.chunk
            )));
        }
        Ok(())
    }
}

/// A range being read ahead: the bytes object it is read into, which no one else can see
/// until the read is done, and where the read says it is done.
struct Ahead {
    start: u64,
    stop: u64,
    out: Py<PyBytes>,
    done: Arc<Done>,
    /// The process whose thread reads it: a child forked meanwhile holds a copy that no
    /// thread of its own will ever finish.
    pid: u32,
}

impl Ahead {
    /// Wait for the read; true when its range was read whole and checked. A forked child's
    /// copy of its parent's read ahead is not waited for: it ends as failed.
    fn finish(self) -> (bool, Py<PyBytes>) {
        if !self.ours() {
            return (false, self.out);
        }
        (self.done.wait(), self.out)
    }

    /// Whether a thread of this process reads it (not a forked child's copy).
    fn ours(&self) -> bool {
        self.pid == std::process::id()
    }
}

/// How a read ahead ended (None while under way), and the signal that it did.
#[derive(Default)]
struct Done {
    result: Mutex<Option<bool>>,
    ended: Condvar,
}

impl Done {
    fn set(&self, ok: bool) {
        *self.result.lock().unwrap_or_else(|e| e.into_inner()) = Some(ok);
        self.ended.notify_all();
    }

    fn wait(&self) -> bool {
        let mut result = self.result.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ok) = *result {
                return ok;
            }
            result = self.ended.wait(result).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Sets a read ahead's end to "failed" if its job ends without saying (a panic).
struct EndGuard(Arc<Done>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        let mut result = self.0.result.lock().unwrap_or_else(|e| e.into_inner());
        if result.is_none() {
            *result = Some(false);
            self.0.ended.notify_all();
        }
    }
}

/// A range to read ahead, and where to say how it ended (said after the thread is listed
/// idle again, so the reader's next range finds it there).
type Job = (Box<dyn FnOnce() -> bool + Send>, EndGuard);

/// Seconds a read-ahead thread waits for its next range before it ends.
const IDLE_FOR: Duration = Duration::from_secs(30);

/// The threads that read ranges ahead, kept between ranges (a thread started for each range
/// cost a sequential reader ~5% of its time: clone3 in its profile). A range goes to an idle
/// thread, or to a new one when none is idle, so a read stuck on one block file (a disk that
/// does not answer) holds up no other reader's; a thread idle for IDLE_FOR ends. A forked
/// child has none of its parent's threads: it starts its own (see after_fork_in_child).
struct Helpers {
    /// Each idle thread's own queue, by the thread's number.
    idle: Vec<(u64, mpsc::Sender<Job>)>,
    started: u64,
}

static HELPERS: Mutex<Option<Helpers>> = Mutex::new(None);

fn helpers() -> std::sync::MutexGuard<'static, Option<Helpers>> {
    HELPERS.lock().unwrap_or_else(|e| e.into_inner())
}

thread_local! {
    /// The list's lock, held by the thread that forks for the length of the fork.
    static HELD_FOR_FORK: std::cell::RefCell<Option<std::sync::MutexGuard<'static, Option<Helpers>>>> =
        const { std::cell::RefCell::new(None) };
}

/// A fork copies the list's lock as it is: taken by a read-ahead thread listing itself idle,
/// it would stay taken in the child, whose first read ahead would wait for it forever. So
/// the thread that forks takes the lock first and lets go of it on both sides; the child
/// then leaves its parent's list unused (its threads are not the child's; the senders in it
/// are not dropped, as a receiver of the parent's may have held their channel's lock).
extern "C" fn before_fork() {
    let guard = helpers();
    HELD_FOR_FORK.with(|held| *held.borrow_mut() = Some(guard));
}

extern "C" fn after_fork_in_parent() {
    HELD_FOR_FORK.with(|held| drop(held.borrow_mut().take()));
}

extern "C" fn after_fork_in_child() {
    HELD_FOR_FORK.with(|held| {
        if let Some(mut guard) = held.borrow_mut().take() {
            std::mem::forget(guard.take());
        }
    });
}

static FORK_HANDLERS: std::sync::Once = std::sync::Once::new();

/// Run `job` on a read-ahead thread.
fn run_ahead(job: Job) -> std::io::Result<()> {
    FORK_HANDLERS.call_once(|| {
        // SAFETY: the handlers take and let go of a lock of this module only.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork_in_parent), Some(after_fork_in_child))
        };
    });
    let mut guard = helpers();
    let helpers = guard.get_or_insert_with(|| Helpers { idle: Vec::new(), started: 0 });
    // An idle thread left the list only under this lock, so it waits on its queue.
    let job = match helpers.idle.pop() {
        Some((_, queue)) => match queue.send(job) {
            Ok(()) => return Ok(()),
            Err(mpsc::SendError(job)) => job,
        },
        None => job,
    };
    let (queue, jobs) = mpsc::channel::<Job>();
    let number = helpers.started;
    helpers.started += 1;
    queue.send(job).map_err(|_| std::io::Error::other("a new read-ahead thread's queue is closed"))?;
    std::thread::Builder::new()
        .name("strata-read-ahead".into())
        .spawn(move || read_ahead_thread(number, queue, jobs))?;
    Ok(())
}

/// A read-ahead thread: its ranges, one at a time, listed idle between them.
fn read_ahead_thread(number: u64, queue: mpsc::Sender<Job>, jobs: mpsc::Receiver<Job>) {
    loop {
        match jobs.recv_timeout(IDLE_FOR) {
            Ok((work, ended)) => {
                let ok = work();
                let listed = match helpers().as_mut() {
                    Some(h) => {
                        h.idle.push((number, queue.clone()));
                        true
                    }
                    None => false,
                };
                ended.0.set(ok);
                if !listed {
                    return;
                }
            }
            Err(_) => {
                let mut guard = helpers();
                let Some(h) = guard.as_mut() else { return };
                match h.idle.iter().position(|(n, _)| *n == number) {
                    Some(at) => {
                        h.idle.swap_remove(at);
                        return;
                    }
                    None => continue, // taken meanwhile: its range is in the queue
                }
            }
        }
    }
}

/// A writable pointer handed to a read-ahead thread, which alone writes through it until the
/// read is done.
struct Target(*mut u8, usize);
unsafe impl Send for Target {}

/// A new bytes object of `len` bytes, not yet filled, and where its bytes are.
fn new_bytes(py: Python<'_>, len: usize) -> PyResult<(Py<PyBytes>, *mut u8)> {
    // SAFETY: a bytes object made from no data holds `len` bytes to be written before
    // anyone reads it; nothing else refers to it yet.
    unsafe {
        let ptr = pyo3::ffi::PyBytes_FromStringAndSize(std::ptr::null(), len as pyo3::ffi::Py_ssize_t);
        let bytes = Bound::from_owned_ptr_or_err(py, ptr)?.cast_into_unchecked::<PyBytes>();
        let data = pyo3::ffi::PyBytes_AsString(bytes.as_ptr()) as *mut u8;
        Ok((bytes.unbind(), data))
    }
}

/// What a BlockFile's readers share: the range read ahead, and where the last read ended.
#[derive(Default)]
struct State {
    ahead: Option<Ahead>,
    /// Where the last range read ended: a range starting there is a sequential reader's.
    last_stop: Option<u64>,
}

/// A block file held open (a descriptor of its own), read in checked ranges; several
/// threads may read through one at once. The lock on its state is held only to take or put
/// a read-ahead, never while reading, waiting or calling into Python.
#[pyclass(module = "strata.cacheserver.native", frozen)]
struct BlockFile {
    block: Arc<Block>,
    state: Mutex<State>,
}

/// Wait (without the interpreter's lock) for a read-ahead no one will use, then let go of it.
fn discard(py: Python<'_>, ahead: Option<Ahead>) {
    if let Some(ahead) = ahead {
        let (_, out) = py.detach(|| ahead.finish());
        drop(out);
    }
}

#[pymethods]
impl BlockFile {
    /// The block file open on `fd` (duplicated: the caller keeps and closes its own), of
    /// `length` bytes with the CRC-32C `checksums` of its `chunk_size` chunks.
    #[new]
    fn new(fd: RawFd, length: u64, checksums: Vec<u32>, chunk_size: u64) -> PyResult<Self> {
        if fd < 0 || chunk_size == 0 {
            return Err(PyValueError::new_err(format!("no block file: descriptor {fd}, chunk size {chunk_size}")));
        }
        if (checksums.len() as u64) < length.div_ceil(chunk_size) {
            return Err(PyValueError::new_err(format!(
                "{} checksums for a block of {length} bytes in {chunk_size}-byte chunks",
                checksums.len()
            )));
        }
        // SAFETY: the caller's descriptor is open for the length of this call; the duplicate
        // is this object's own.
        let owned = unsafe { BorrowedFd::borrow_raw(fd) }
            .try_clone_to_owned()
            .map_err(|e| PyOSError::new_err(format!("cannot duplicate descriptor {fd}: {e}")))?;
        let block = Block { file: File::from(owned), length, checksums, chunk: chunk_size };
        Ok(BlockFile { block: Arc::new(block), state: Mutex::default() })
    }

    /// The block's length in bytes.
    #[getter]
    fn length(&self) -> u64 {
        self.block.length
    }

    /// The length of the chunks each checksum covers.
    #[getter]
    fn chunk_size(&self) -> u64 {
        self.block.chunk
    }

    /// Bytes [start, stop) of the block (chunk-aligned), every chunk checked; None when the
    /// file holds fewer bytes or a chunk fails its checksum. With `ahead`, when the range
    /// follows the one read before (or starts the block), the range after it, of the same
    /// length, is then read and checked in a thread of its own, for a reader going on.
    #[pyo3(signature = (start, stop, ahead = true))]
    fn read(&self, py: Python<'_>, start: u64, stop: u64, ahead: bool) -> PyResult<Option<Py<PyBytes>>> {
        self.block.check_span(start, stop)?;
        let (held, sequential) = {
            let mut state = self.lock();
            let sequential = start == 0 || state.last_stop == Some(start);
            state.last_stop = Some(stop);
            (state.ahead.take(), sequential)
        };
        let result = match held {
            Some(held) if held.start == start && held.stop == stop && held.ours() => {
                let (ok, out) = py.detach(|| held.finish());
                ok.then_some(out)
            }
            other => {
                discard(py, other);
                let (out, data) = new_bytes(py, (stop - start) as usize)?;
                let target = Target(data, (stop - start) as usize);
                let block = &self.block;
                let ok = py.detach(move || {
                    let target = target;
                    // SAFETY: the bytes object is this call's alone until it returns.
                    let buf = unsafe { std::slice::from_raw_parts_mut(target.0, target.1) };
                    block.fill_checked_split(buf, start)
                });
                ok.then_some(out)
            }
        };
        if ahead && sequential && result.is_some() && start < stop && stop < self.block.length {
            let next = self.read_ahead(py, stop, (stop + (stop - start)).min(self.block.length))?;
            let replaced = self.lock().ahead.replace(next);
            discard(py, replaced);
        }
        Ok(result)
    }

    /// Bytes from `start` (a chunk boundary) into `out`, a writable buffer of whole chunks
    /// (or ending at the block's end), every chunk checked, without the interpreter's lock;
    /// false when the file holds fewer bytes or a chunk fails its checksum.
    fn read_into(&self, py: Python<'_>, out: PyBuffer<u8>, start: u64) -> PyResult<bool> {
        if out.readonly() || !out.is_c_contiguous() {
            return Err(PyValueError::new_err("read_into needs a writable, contiguous buffer"));
        }
        let len = out.len_bytes();
        self.block.check_span(start, start + len as u64)?;
        let held = {
            let mut state = self.lock();
            state.last_stop = Some(start + len as u64);
            state.ahead.take()
        };
        discard(py, held);
        let target = Target(out.buf_ptr() as *mut u8, len);
        let block = &self.block;
        let ok = py.detach(move || {
            let target = target;
            // SAFETY: the buffer is held (and so kept in place) by `out` for this call; the
            // caller does not use it until the call returns.
            let buf = unsafe { std::slice::from_raw_parts_mut(target.0, target.1) };
            block.fill_checked_split(buf, start)
        });
        drop(out);
        Ok(ok)
    }

    /// Whether the file still has a name (a link) in its folder: a worker unlinks a block
    /// file when it evicts the block, moves it to another tier or drops a damaged copy, after
    /// which this descriptor reads a copy the worker no longer keeps. False too when the
    /// file cannot be asked (fstat fails).
    fn linked(&self) -> bool {
        self.block.file.metadata().map(|m| m.nlink() > 0).unwrap_or(false)
    }

    /// Stop reading ahead (waiting for a read under way); the descriptor closes with the object.
    fn close(&self, py: Python<'_>) {
        let held = self.lock().ahead.take();
        discard(py, held);
    }
}

impl BlockFile {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // (no code panics while holding it; a poisoned state is still whole)
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn read_ahead(&self, py: Python<'_>, start: u64, stop: u64) -> PyResult<Ahead> {
        let (out, data) = new_bytes(py, (stop - start) as usize)?;
        let target = Target(data, (stop - start) as usize);
        let block = Arc::clone(&self.block);
        let done = Arc::new(Done::default());
        let work = Box::new(move || {
            let target = target;
            // SAFETY: the bytes object is kept alive by `Ahead::out`, which is let go of only
            // after the read is done (`Done`); nothing reads it before then.
            let buf = unsafe { std::slice::from_raw_parts_mut(target.0, target.1) };
            block.fill_checked(buf, start)
        });
        run_ahead((work, EndGuard(Arc::clone(&done))))
        .map_err(|e| PyOSError::new_err(format!("cannot read ahead: {e}")))?;
        Ok(Ahead { start, stop, out, done, pid: std::process::id() })
    }
}

impl Drop for BlockFile {
    fn drop(&mut self) {
        // The thread writes into a bytes object this object owns: it ends before that goes.
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let Some(ahead) = state.ahead.take() {
            let (_, out) = ahead.finish();
            drop(out);
        }
    }
}

/// How a receive ended: all it was asked for, nothing more within the timeout, or the
/// peer closed the connection.
const COMPLETE: u8 = 0;
const TIMED_OUT: u8 = 1;
const CLOSED: u8 = 2;

/// The longest reply line a worker sends (a block's checksums, a file's status).
const MAX_LINE: usize = 4 << 20;
/// Bytes taken from a socket at a time while a reply line comes: a block's reply (256
/// checksums) fits; zeroed on every exchange, so no larger than that.
const REPLY_BUFFER: usize = 8 << 10;

/// Wait until `fd` is ready for `events`; false when `timeout_ms` passed first (or a signal
/// came: the caller returns to Python, which handles it and waits on).
fn ready(fd: RawFd, events: libc::c_short, timeout_ms: i32) -> std::io::Result<bool> {
    let mut poll = libc::pollfd { fd, events, revents: 0 };
    // SAFETY: one valid pollfd.
    let n = unsafe { libc::poll(&mut poll, 1, timeout_ms) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return if e.kind() == std::io::ErrorKind::Interrupted { Ok(false) } else { Err(e) };
    }
    Ok(n > 0)
}

/// recv(2) into `buf`; None when it would block (or a signal came).
fn recv_some(fd: RawFd, buf: &mut [u8], flags: libc::c_int) -> std::io::Result<Option<usize>> {
    // SAFETY: `buf` is writable for its length.
    let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), flags | libc::MSG_DONTWAIT) };
    if n >= 0 {
        return Ok(Some(n as usize));
    }
    let e = std::io::Error::last_os_error();
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
        _ => Err(e),
    }
}

fn send_all(fd: RawFd, mut data: &[u8], timeout_ms: i32) -> std::io::Result<()> {
    while !data.is_empty() {
        // SAFETY: `data` is readable for its length.
        let n = unsafe { libc::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            data = &data[n as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::WouldBlock => {
                if !ready(fd, libc::POLLOUT, timeout_ms)? {
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "the peer took no request"));
                }
            }
            std::io::ErrorKind::Interrupted => continue,
            _ => return Err(e),
        }
    }
    Ok(())
}

/// Receive through the end of a line: the bytes consumed, and how it ended.
fn receive_line(fd: RawFd, timeout_ms: i32) -> std::io::Result<(Vec<u8>, u8)> {
    let mut line = Vec::new();
    let mut peek = vec![0u8; REPLY_BUFFER];
    loop {
        let n = match recv_some(fd, &mut peek, libc::MSG_PEEK)? {
            Some(0) => return Ok((line, CLOSED)),
            Some(n) => n,
            None => {
                if !ready(fd, libc::POLLIN, timeout_ms)? {
                    return Ok((line, TIMED_OUT));
                }
                continue;
            }
        };
        // Take the line's bytes and none past it: the payload stays in the socket.
        let end = peek[..n].iter().position(|&b| b == b'\n');
        let take = end.map_or(n, |e| e + 1);
        let start = line.len();
        line.resize(start + take, 0);
        let mut got = 0;
        while got < take {
            match recv_some(fd, &mut line[start + got..start + take], 0)? {
                Some(0) => return Ok((line, CLOSED)),
                Some(k) => got += k,
                None => continue, // (peeked bytes are there to be taken)
            }
        }
        if end.is_some() {
            return Ok((line, COMPLETE));
        }
        if line.len() > MAX_LINE {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a reply line longer than {MAX_LINE} bytes"),
            ));
        }
    }
}

/// recvmsg(2) into `buf` with up to `max_fds` descriptors (SCM_RIGHTS, close-on-exec) into
/// `fds`; None when it would block (or a signal came).
fn recv_with_fds(fd: RawFd, buf: &mut [u8], max_fds: usize, fds: &mut Vec<RawFd>) -> std::io::Result<Option<usize>> {
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE((max_fds * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8).max(1)]; // (aligned for cmsghdr)
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: a zeroed msghdr is valid; every pointer set below lives through the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` describes writable memory of the lengths it names.
    let n = unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: the kernel filled the control buffer `msg` points to; the macros walk it
    // within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(std::ptr::read_unaligned(data.add(i)));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(Some(n as usize))
}

/// Send `request` (when given) on the connected Unix socket `fd` and receive until a newline
/// has come, with the descriptors sent along (at most `max_fds` a message), the interpreter's
/// lock let go once for all: (the bytes received, which may go on past the line; the
/// descriptors, the caller's to close; status as `exchange`).
#[pyfunction]
#[pyo3(signature = (fd, request, timeout, max_fds))]
fn exchange_fds(
    py: Python<'_>,
    fd: RawFd,
    request: Option<&[u8]>,
    timeout: f64,
    max_fds: usize,
) -> PyResult<(Py<PyBytes>, Vec<RawFd>, u8)> {
    let wait = timeout_ms(timeout);
    let request = request.map(|r| r.to_vec());
    let mut fds = Vec::new();
    let result = py.detach(|| -> std::io::Result<(Vec<u8>, u8)> {
        if let Some(request) = request {
            send_all(fd, &request, wait)?;
        }
        let mut data = Vec::new();
        let mut buf = vec![0u8; REPLY_BUFFER];
        loop {
            match recv_with_fds(fd, &mut buf, max_fds, &mut fds)? {
                Some(0) => return Ok((data, CLOSED)),
                Some(n) => {
                    data.extend_from_slice(&buf[..n]);
                    if buf[..n].contains(&b'\n') {
                        return Ok((data, COMPLETE));
                    }
                    if data.len() > MAX_LINE {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!("a reply line longer than {MAX_LINE} bytes"),
                        ));
                    }
                }
                None => {
                    if !ready(fd, libc::POLLIN, wait)? {
                        return Ok((data, TIMED_OUT));
                    }
                }
            }
        }
    });
    match result {
        Ok((data, status)) => {
            py.check_signals().inspect_err(|_| close_all(&fds))?;
            Ok((PyBytes::new(py, &data).unbind(), fds, status))
        }
        Err(e) => {
            close_all(&fds);
            Err(PyOSError::new_err(format!("short-circuit socket: {e}")))
        }
    }
}

fn close_all(fds: &[RawFd]) {
    for &fd in fds {
        // SAFETY: descriptors this call received and no one else holds.
        unsafe { libc::close(fd) };
    }
}

fn timeout_ms(seconds: f64) -> i32 {
    (seconds * 1000.0).ceil().clamp(0.0, i32::MAX as f64) as i32
}

/// Send `request` (when given) on the connected socket `fd` and receive the reply line,
/// with the interpreter's lock let go once for both: (the bytes received, which end with the
/// line's newline when `status` is COMPLETE; `status`). TIMED_OUT: nothing came for `timeout`
/// seconds (call again with no request to wait on); CLOSED: the peer closed the connection.
#[pyfunction]
#[pyo3(signature = (fd, request, timeout))]
fn exchange(py: Python<'_>, fd: RawFd, request: Option<&[u8]>, timeout: f64) -> PyResult<(Py<PyBytes>, u8)> {
    let wait = timeout_ms(timeout);
    let request = request.map(|r| r.to_vec());
    let (line, status) = py
        .detach(move || -> std::io::Result<(Vec<u8>, u8)> {
            if let Some(request) = request {
                send_all(fd, &request, wait)?;
            }
            receive_line(fd, wait)
        })
        .map_err(|e| PyOSError::new_err(format!("block socket: {e}")))?;
    py.check_signals()?;
    Ok((PyBytes::new(py, &line).unbind(), status))
}

/// Receive `size` bytes from the socket `fd` into a new bytes object, and check them against
/// `checksums` (CRC-32C of each `chunk_size` piece) once all came, with the interpreter's
/// lock let go once for both: (the bytes, how many came, the first chunk that failed or None,
/// status). The bytes past those that came are zeros, not the payload's: a caller that got
/// fewer takes the received ones and waits on.
#[pyfunction]
fn receive_checked(
    py: Python<'_>,
    fd: RawFd,
    size: usize,
    checksums: Vec<u32>,
    chunk_size: usize,
    timeout: f64,
) -> PyResult<(Py<PyBytes>, usize, Option<usize>, u8)> {
    if chunk_size == 0 || checksums.len() != size.div_ceil(chunk_size) {
        return Err(PyValueError::new_err(format!(
            "{} checksums for {size} bytes in {chunk_size}-byte chunks",
            checksums.len()
        )));
    }
    let wait = timeout_ms(timeout);
    let (out, data) = new_bytes(py, size)?;
    let target = Target(data, size);
    let (got, bad, status) = py
        .detach(move || -> std::io::Result<(usize, Option<usize>, u8)> {
            let target = target;
            // SAFETY: the bytes object is this call's alone until it returns.
            let buf = unsafe { std::slice::from_raw_parts_mut(target.0, target.1) };
            let mut got = 0;
            while got < size {
                let ended = match recv_some(fd, &mut buf[got..], 0)? {
                    Some(0) => Some(CLOSED),
                    Some(n) => {
                        got += n;
                        None
                    }
                    None => (!ready(fd, libc::POLLIN, wait)?).then_some(TIMED_OUT),
                };
                if let Some(status) = ended {
                    buf[got..].fill(0); // (never memory this process held before)
                    return Ok((got, None, status));
                }
            }
            let bad = buf
                .chunks(chunk_size)
                .zip(&checksums)
                .position(|(piece, &sum)| crc32c(piece) != sum);
            Ok((got, bad, COMPLETE))
        })
        .map_err(|e| PyOSError::new_err(format!("block socket: {e}")))?;
    py.check_signals()?;
    Ok((out, got, bad, status))
}

/// Index of the first `chunk_size` chunk of `data` (which starts at chunk-aligned offset
/// `start` of a block with these `checksums`) whose CRC-32C is wrong, or None when all match,
/// checked without the interpreter's lock.
#[pyfunction]
fn first_bad_chunk(py: Python<'_>, data: PyBuffer<u8>, start: u64, checksums: Vec<u32>, chunk_size: u64) -> PyResult<Option<usize>> {
    if !data.is_c_contiguous() || chunk_size == 0 {
        return Err(PyValueError::new_err("first_bad_chunk needs a contiguous buffer and a chunk size"));
    }
    let first = (start / chunk_size) as usize;
    let target = Target(data.buf_ptr() as *mut u8, data.len_bytes());
    let bad = py.detach(move || {
        let target = target;
        // SAFETY: `data` holds the buffer in place for this call, and it is only read.
        let bytes = unsafe { std::slice::from_raw_parts(target.0 as *const u8, target.1) };
        bytes
            .chunks(chunk_size as usize)
            .enumerate()
            .position(|(i, piece)| checksums.get(first + i).is_none_or(|&sum| crc32c(piece) != sum))
            .map(|i| first + i)
    });
    drop(data);
    Ok(bad)
}

#[pymodule]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockFile>()?;
    m.add_function(wrap_pyfunction!(exchange, m)?)?;
    m.add_function(wrap_pyfunction!(exchange_fds, m)?)?;
    m.add_function(wrap_pyfunction!(receive_checked, m)?)?;
    m.add_function(wrap_pyfunction!(first_bad_chunk, m)?)?;
    m.add("COMPLETE", COMPLETE)?;
    m.add("TIMED_OUT", TIMED_OUT)?;
    m.add("CLOSED", CLOSED)?;
    Ok(())
}
