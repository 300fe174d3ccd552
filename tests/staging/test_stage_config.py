"""The trainer's ``data.stage`` key: a local folder other than ``data.path``, or a one-line ConfigError."""

from __future__ import annotations

import pytest

from imgpipe.errors import ConfigError
from imgpipe.train.config import load_config


def test_data_stage_is_read_and_the_loaders_read_the_copy() -> None:
    config = load_config(None, ["data.path=s3://bucket/imagenet", "data.stage=/nvme/imagenet"])
    assert (config.data.path, config.data.stage, config.data.location) == ("s3://bucket/imagenet", "/nvme/imagenet", "/nvme/imagenet")
    assert load_config(None, ["data.path=/data/rec"]).data.location == "/data/rec"


@pytest.mark.parametrize(
    "items, words",
    [
        (["data.path=/data/rec", "data.stage=s3://bucket/copy"], "data.stage must be a folder on each node's disk, not a URL"),
        (["data.stage=/nvme/imagenet"], "data.stage needs data.path"),
        (["data.path=/data/rec", "data.stage=/data/rec/"], "data.stage is data.path itself"),
    ],
)
def test_a_wrong_data_stage_is_one_line_naming_the_set_item(items: list[str], words: str) -> None:
    with pytest.raises(ConfigError, match=words) as raised:
        load_config(None, items)
    assert str(raised.value).startswith("--set data.stage=") and "\n" not in str(raised.value)
