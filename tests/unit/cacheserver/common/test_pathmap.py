"""PathMap: values by path that forget a tree at the cost of what is held in it."""

from __future__ import annotations

from strata.cacheserver.common.pathmap import PathMap


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class _Watched(str):
    """A path that counts how often a map compares or hashes it: what a drop visits."""

    looks = 0

    def __hash__(self) -> int:
        _Watched.looks += 1
        return str.__hash__(self)

    def __eq__(self, other: object) -> bool:
        _Watched.looks += 1
        return str.__eq__(self, other)

    def startswith(self, *args: object) -> bool:  # type: ignore[override]
        _Watched.looks += 1
        return str.startswith(self, *args)  # type: ignore[arg-type]


def _held(held: PathMap[int], paths: list[str]) -> list[str]:
    return [p for p in paths if held.get(p) is not None]


def test_a_tree_drop_forgets_the_path_and_everything_below_it_and_nothing_beside_it() -> None:
    held: PathMap[int] = PathMap()
    paths = ["/a", "/a/b", "/a/b/c", "/a/bc", "/ab", "/x/y"]
    for number, path in enumerate(paths):
        held.put(path, number)
    assert held.drop_tree("/a/b") == 2
    assert _held(held, paths) == ["/a", "/a/bc", "/ab", "/x/y"]
    assert held.drop_tree("/") == 4
    assert len(held) == 0


def test_a_drop_below_keeps_the_path_itself_and_finds_what_is_held_under_folders_not_held() -> None:
    held: PathMap[int] = PathMap()
    for path in ("/d", "/d/e/f/g", "/d/e/h", "/dd"):
        held.put(path, 1)
    assert held.drop_below("/d") == 2
    assert _held(held, ["/d", "/d/e/f/g", "/d/e/h", "/dd"]) == ["/d", "/dd"]
    # What was forgotten is forgotten: a later put below the folder is found by the next drop.
    held.put("/d/e/i", 2)
    assert held.drop_below("/d") == 1


def test_relative_paths_have_the_empty_root() -> None:
    held: PathMap[int] = PathMap()
    for path in ("", "a", "a/b", "c"):
        held.put(path, 1)
    assert held.drop_tree("a") == 2
    assert _held(held, ["", "a", "a/b", "c"]) == ["", "c"]
    assert held.drop_tree("") == 2
    assert len(held) == 0


def test_an_ancestors_drop_forgets_the_folders_above_a_path_only() -> None:
    held: PathMap[int] = PathMap()
    paths = ["", "a", "a/b", "a/b/c", "a/b/c/d", "a/x", "b"]
    for path in paths:
        held.put(path, 1)
    assert held.drop_ancestors("a/b/c") == 3
    assert _held(held, paths) == ["a/b/c", "a/b/c/d", "a/x", "b"]
    assert held.drop_tree("a") == 3  # the index still leads to what is below the dropped folders
    assert _held(held, paths) == ["b"]


def test_at_most_limit_values_are_held_the_least_recently_used_going_first() -> None:
    held: PathMap[str] = PathMap(limit=3)
    for path in ("/a", "/b", "/c"):
        held.put(path, path)
    held.touch("/a")
    held.put("/d", "/d")
    assert _held(held, ["/a", "/b", "/c", "/d"]) == ["/a", "/c", "/d"]
    held.put("/c", "again")  # a put is a use
    held.put("/e/f", "/e/f")
    assert _held(held, ["/a", "/c", "/d", "/e/f"]) == ["/c", "/d", "/e/f"]
    assert held.get("/c") == "again"


def test_an_evicted_path_leaves_no_trace_in_the_index() -> None:
    held: PathMap[int] = PathMap(limit=1)
    for number in range(1000):
        held.put(f"/t{number}/deep/path", number)
    assert len(held) == 1
    assert len(held._below) == 3  # "/", "/t999", "/t999/deep": only what leads to the one held


def test_a_value_is_held_for_ttl_seconds_after_it_was_put() -> None:
    clock = _Clock()
    held: PathMap[int] = PathMap(ttl=5, clock=clock)
    held.put("/a", 1)
    clock.now += 3
    held.put("/b", 2)
    held.touch("/a")  # a use does not lengthen its time
    clock.now += 2.5
    assert held.get("/a") is None
    assert held.get("/b") == 2
    assert len(held) == 1  # the expired one is forgotten as it is found
    clock.now += 3
    assert held.get("/b") is None


def test_a_drop_visits_only_what_is_held_in_the_tree_however_much_is_held_elsewhere() -> None:
    held: PathMap[int] = PathMap(limit=200_000)
    for number in range(100_000):
        held.put(_Watched(f"/elsewhere/{number % 100}/{number}"), number)
    for number in range(10):
        held.put(f"/tree/{number}", number)
    _Watched.looks = 0
    assert held.drop_tree("/tree") == 10
    assert _Watched.looks == 0
    assert len(held) == 100_000


def test_a_page_put_at_once_leaves_what_one_put_after_another_leaves() -> None:
    page = [(f"/m/d{folder}/f{i}", folder * 10 + i) for folder in range(4) for i in range(5)]
    one_by_one: PathMap[int] = PathMap(limit=12)
    at_once: PathMap[int] = PathMap(limit=12)
    for held in (one_by_one, at_once):
        held.put("/m/d0/f0", -1)
        held.put("/x/y", 99)
    for path, value in page:
        one_by_one.put(path, value)
    at_once.put_many(page)
    paths = [p for p, _ in page] + ["/x/y"]
    assert _held(at_once, paths) == _held(one_by_one, paths) == [p for p, _ in page[-12:]]
    assert at_once._below == one_by_one._below  # the index too: only what leads to what is held
    assert at_once.drop_below("/m/d2") == 5 and at_once.get("/m/d3/f4") == 34


def test_holds_tells_whether_anything_is_held_at_or_below_a_path() -> None:
    held: PathMap[int] = PathMap(limit=2)
    held.put("/a/b/c", 1)
    assert held.holds("/a/b/c") and held.holds("/a/b") and held.holds("/a") and held.holds("/")
    assert not held.holds("/a/x") and not held.holds("/a/b/c/d") and not held.holds("/b")
    held.put("/x", 2)
    held.put("/y", 3)  # /a/b/c goes: the least recently used
    assert not held.holds("/a") and held.holds("/x")
