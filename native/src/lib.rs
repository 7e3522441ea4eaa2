//! Strata's compiled core: a block file of this node's worker read and checked outside
//! the interpreter's lock.
//!
//! A short-circuit reader reads ranges of a block file the worker handed it and checks each
//! chunk against the block's CRC-32C checksums. In Python the check takes the interpreter's
//! lock back after each call, and a thread reading the next range ahead only runs when the
//! reader blocks: the read, the check and the reader's own work on the bytes follow one
//! another. Here the read and the check run without the lock, and a sequential reader's next
//! range is read and checked in a thread of its own while the reader works on this one.

use std::fs::File;
use std::os::fd::{BorrowedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Ranges at least this long are read and checked by two threads, half each.
const SPLIT_AT: usize = 4 << 20;
/// Bytes read (one pread) and then checked at a time: small enough to be checked while in
/// the core's cache (L2), large enough that the calls cost little (4,096 a GiB).
const PIECE: usize = 256 << 10;

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
                    self.checksums.get(index).is_some_and(|&sum| crc32c::crc32c(bytes) == sum)
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
/// until the thread is joined, and the thread.
struct Ahead {
    start: u64,
    stop: u64,
    out: Py<PyBytes>,
    task: JoinHandle<bool>,
}

impl Ahead {
    /// Wait for the thread; true when its range was read whole and checked.
    fn finish(self) -> (bool, Py<PyBytes>) {
        let ok = self.task.join().unwrap_or(false);
        (ok, self.out)
    }
}

/// A writable pointer handed to the read-ahead thread, which alone writes through it until
/// it is joined.
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
            Some(held) if held.start == start && held.stop == stop => {
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
        let task = std::thread::Builder::new()
            .name("strata-read-ahead".into())
            .spawn(move || {
                let target = target;
                // SAFETY: the bytes object is kept alive by `Ahead::out`, which is dropped only
                // after this thread is joined; nothing reads it before then.
                let buf = unsafe { std::slice::from_raw_parts_mut(target.0, target.1) };
                block.fill_checked(buf, start)
            })
            .map_err(|e| PyOSError::new_err(format!("cannot start a read-ahead thread: {e}")))?;
        Ok(Ahead { start, stop, out, task })
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

#[pymodule]
fn native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<BlockFile>()?;
    Ok(())
}
