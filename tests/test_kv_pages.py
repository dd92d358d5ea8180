"""The host's page table of the paged KV cache (app/kv_pages.py): pages taken and given back, the scratch page
everywhere else."""

import numpy as np
import pytest

from omnijax.app.kv_pages import PageTable, pages_for
from omnijax.decoder.kv_cache import PAGE


def test_pages_for_rounds_up_to_whole_pages():
    assert [pages_for(n) for n in (1, PAGE, PAGE + 1, 3 * PAGE)] == [1, 1, 2, 3]


def test_a_slot_takes_free_pages_and_gives_them_back():
    t = PageTable(slots=3, per_row=4, pages=5)
    assert (t.table == 5).all() and t.free == 5
    t.take(1, 2 * PAGE + 1)
    assert t.table[1].tolist() == [0, 1, 2, 5] and t.free == 2
    assert t.fits(2 * PAGE) and not t.fits(2 * PAGE + 1)
    t.take(0, PAGE)
    assert t.table[0].tolist() == [3, 5, 5, 5]
    version = t.version
    t.give_back(1)
    assert (t.table[1] == 5).all() and t.free == 4 and t.version > version
    t.take(2, 4 * PAGE)  # the pages another slot gave back
    assert sorted(t.table[2].tolist()) == [0, 1, 2, 4]
    t.give_back(1)  # holds none: nothing changes
    assert t.free == 0
    t.reset()
    assert (t.table == 5).all() and t.free == 5


def test_a_slot_cannot_take_more_than_is_free_or_twice():
    t = PageTable(slots=2, per_row=3, pages=4)
    with pytest.raises(ValueError, match="pages asked"):
        t.take(0, 4 * PAGE)  # more than a row's table holds
    t.take(0, 3 * PAGE)
    with pytest.raises(ValueError, match="pages asked"):
        t.take(1, 2 * PAGE)  # one page is free
    with pytest.raises(ValueError, match="holds pages"):
        t.take(0, 1)
    assert np.count_nonzero(t.table != 4) == 3


def test_a_request_takes_pages_in_every_pool_up_to_its_span():
    """The context's pool and a ring's: a request of more positions than the ring holds takes the whole ring."""
    from omnijax.app.kv_pages import KVPages

    p = KVPages(slots=2, spans=(4 * PAGE, PAGE), pools=(5, 2))
    p.take(0, 3 * PAGE)
    assert [t.free for t in p.tables] == [2, 1] and p.free == 3 and p.pages == 7
    assert p.fits(2 * PAGE) and not p.fits(3 * PAGE)
    p.take(1, 10)
    assert not p.fits(1)  # the ring's pool is spent
    version = p.version
    p.give_back(0)
    assert [t.free for t in p.tables] == [4, 1] and p.version > version


def test_the_budget_gives_the_rings_up_to_half_and_every_pool_one_whole_row():
    """``Slots._pool_pages``: every slot's whole context and ring where the budget holds them; else the rings share
    up to half of it and the context's pool the rest, each pool at least one whole context / ring."""
    from types import SimpleNamespace

    from omnijax.app.slots import Slots

    mb = 2**20

    def pools(budget_bytes, slots=4, page_bytes=(mb, mb), paged=True):
        ns = SimpleNamespace(slots=slots, spans=(8 * PAGE, 2 * PAGE), paged=paged, page_bytes=lambda: page_bytes)
        return Slots._pool_pages(ns, budget_bytes / mb)

    assert pools(40 * mb) == (32, 8)  # 4 slots x (8 + 2) pages of 1 MB: all of it
    assert pools(20 * mb) == (12, 8)  # the rings (8 MB) within half: whole; the context's pool the rest
    assert pools(10 * mb) == (8, 5)  # rings: half of 10 MB; the context's pool: what is left, at least one context
    assert pools(1 * mb) == (8, 2)  # below one row of each: one row of each
    assert pools(1 * mb, paged=False) == (32, 8)  # rows per slot: the budget does not apply
