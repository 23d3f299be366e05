"""python -m ferry.bench's argument parsing (the measuring itself needs GPUs and torch)."""

import argparse

import pytest

from ferry.bench import parse_size


def test_sizes_take_binary_units():
    assert parse_size("1K") == 1024
    assert parse_size("64M") == 64 << 20
    assert parse_size("1GB") == 1 << 30
    assert parse_size("4096") == 4096


@pytest.mark.parametrize("bad", ["nan", "inf", "0", "-1K", "2T", "lots"])
def test_nonsense_sizes_are_refused(bad):
    with pytest.raises((argparse.ArgumentTypeError, ValueError)):
        parse_size(bad)
