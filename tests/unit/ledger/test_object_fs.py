"""``ledger.storage.object_fs``: configurations are checked, URLs round-trip without
credentials, and both drivers open a filesystem that stores and ranges over objects."""

from __future__ import annotations

import pytest

from ledger.storage.object_fs import BucketConfig, BucketConfigError


@pytest.mark.parametrize("url", ["s3://bucket", "s3://bucket/a/b", "file:///var/data/x"])
def test_a_url_round_trips(url: str) -> None:
    assert BucketConfig.from_url(url).to_url() == url


@pytest.mark.parametrize(("url", "named"), [
    ("http://bucket/x", "http://bucket/x"),
    ("s3://key:secret@bucket/x", "credentials"),
    ("file://host/dir", "file://host/dir"),
])
def test_a_bad_url_is_refused_by_name(url: str, named: str) -> None:
    with pytest.raises(BucketConfigError, match=named):
        BucketConfig.from_url(url)


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"driver": "gcs", "bucket": "b"}, "gcs"),
    ({"driver": "aws-s3", "bucket": ""}, "bucket"),
    ({"driver": "filesystem", "bucket": "relative/dir"}, "relative/dir"),
    ({"driver": "aws-s3", "bucket": "b/c"}, "b/c"),
    ({"driver": "S3", "bucket": "b", "endpoint": "127.0.0.1:9000"}, "127.0.0.1:9000"),
])
def test_a_bad_config_is_refused_by_name(kwargs: dict, named: str) -> None:
    with pytest.raises(BucketConfigError, match=named):
        BucketConfig(**kwargs)


def test_the_driver_takes_pulsars_aliases() -> None:
    assert BucketConfig("S3", "b").driver == "aws-s3"


def _store_and_range(config: BucketConfig) -> None:
    fs = config.open()
    name = f"{config.base}/ledgers/obj"
    fs.create_dir(f"{config.base}/ledgers", recursive=True)
    with fs.open_output_stream(name) as out:
        out.write(bytes(range(256)) * 64)
    with fs.open_input_file(name) as source:
        assert source.size() == 256 * 64
        assert source.read_at(4, 300) == bytes(range(44, 48))


def test_the_filesystem_driver_stores_objects(tmp_path) -> None:
    _store_and_range(BucketConfig("filesystem", str(tmp_path / "bucket"), "cluster-a"))


def test_the_s3_driver_stores_objects_on_a_real_server(s3_bucket: BucketConfig) -> None:
    _store_and_range(BucketConfig(s3_bucket.driver, s3_bucket.bucket, "cluster-a", s3_bucket.endpoint, s3_bucket.region))
