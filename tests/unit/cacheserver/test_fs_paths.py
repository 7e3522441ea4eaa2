from __future__ import annotations

import pytest

from strata.cacheserver.client.fs import StrataFileSystem


@pytest.mark.parametrize("url,path", [
    ("strata:///datasets/x/part-0.parquet", "/datasets/x/part-0.parquet"),
    ("strata://master:19998/datasets/x", "/datasets/x"),
    ("/datasets/x/", "/datasets/x"),
    ("datasets/x", "/datasets/x"),
    ("strata:///", "/"),
])
def test_urls_map_to_namespace_paths(url: str, path: str) -> None:
    assert StrataFileSystem._strip_protocol(url) == path


def test_master_in_the_url_becomes_the_master_option() -> None:
    assert StrataFileSystem._get_kwargs_from_urls("strata://m.ns.svc:19998/a") == {"master": "m.ns.svc:19998"}
    assert StrataFileSystem._get_kwargs_from_urls("strata:///a") == {}
