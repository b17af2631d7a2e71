"""The /dev/shm fit arithmetic (autotune.shmfit): live batches, margin, budget, advice."""

from types import SimpleNamespace

import pytest

from autotune.shmfit import (MARGIN, NCCL_SHM_PER_RANK, SLACK_BYTES, BatchBytes, fits,
                             live_batches, max_live_batches, measure_batch, needed_bytes,
                             shm_advice, shm_budget, size_flag)

MiB = 2**20
# 64 x 3x224x224 float32 images and 64 int64 labels: the resnet50 preset's batch.
F32_BATCH = BatchBytes(64 * 3 * 224 * 224 * 4 + 64 * 8, 64 * 3 * 224 * 224 * 4)


def _env(total=64 * MiB, free=64 * MiB, budget=None, limit=None):
    return SimpleNamespace(shm_budget=lambda: free if budget is None else budget,
                           shm=SimpleNamespace(total_bytes=total, free_bytes=free, note=None),
                           memory=SimpleNamespace(limit_bytes=limit))


def test_live_batches_counts_the_index_torch_queues_ahead():
    assert live_batches(0, None) == 0
    assert live_batches(1, 1) == 2
    assert live_batches(4, 2) == 9
    assert live_batches(3, None) == 7  # torch's default prefetch_factor 2


def test_float32_resnet_batch_only_fits_without_workers_in_64_mib():
    bud = shm_budget(_env())
    assert bud.budget_bytes == 64 * MiB
    assert fits(0, None, F32_BATCH.total, bud.budget_bytes)
    assert not fits(1, 1, F32_BATCH.total, bud.budget_bytes)
    assert needed_bytes(1, 1, F32_BATCH.total) == int(-(-2 * F32_BATCH.total * MARGIN // 1)) + SLACK_BYTES
    # uint8: a quarter, 9.2 MiB: 5 live batches fit (workers x prefetch up to 4)
    assert F32_BATCH.as_uint8 == 64 * 3 * 224 * 224 + 64 * 8
    assert max_live_batches(F32_BATCH.as_uint8, bud.budget_bytes) == 5
    assert fits(2, 2, F32_BATCH.as_uint8, bud.budget_bytes)
    assert not fits(4, 2, F32_BATCH.as_uint8, bud.budget_bytes)


def test_unknown_figures_refuse_nothing():
    assert fits(8, 8, None, 64 * MiB)
    assert fits(8, 8, 10**12, None)


def test_budget_is_split_across_ranks_after_nccl():
    bud = shm_budget(_env(), ranks=2, nccl=True)
    assert bud.reserved_bytes == 2 * NCCL_SHM_PER_RANK
    assert bud.budget_bytes == (64 * MiB - 2 * NCCL_SHM_PER_RANK) // 2
    assert "NCCL" in bud.source
    # the cgroup's remaining memory binds below the free /dev/shm
    low = shm_budget(_env(budget=16 * MiB, limit=1 << 30))
    assert low.budget_bytes == 16 * MiB and "cgroup" in low.source
    none = shm_budget(SimpleNamespace(shm_budget=lambda: None, memory=None,
                                      shm=SimpleNamespace(total_bytes=None, free_bytes=None,
                                                          note="no /dev/shm")))
    assert none.budget_bytes is None


def test_without_nccl_the_ranks_share_the_whole_of_dev_shm():
    """Gloo ranks on a CPU node keep nothing in /dev/shm: holding 20 MiB a rank back for
    NCCL left 4 ranks in Docker's 64 MiB no budget at all, and every rank's loader ran with
    no workers for the whole run (a user's torchrun review)."""
    bud = shm_budget(_env(), ranks=4, nccl=False)
    assert bud.reserved_bytes == 0 and bud.budget_bytes == 16 * MiB
    assert "NCCL" in bud.source and "none held back" in bud.source
    assert shm_budget(_env(), ranks=4, nccl=True).budget_bytes == 0
    assert shm_budget(_env(), ranks=1, nccl=True).reserved_bytes == 0


@pytest.mark.parametrize("n,docker,k8s", [(1, "64m", "64Mi"), (437 * MiB, "448m", "448Mi"),
                                          (960 * MiB + 1, "1g", "1Gi"),
                                          (3 * 2**30 + 1, "4g", "4Gi")])
def test_size_rounds_up(n, docker, k8s):
    assert size_flag(n) == (docker, k8s)


def test_advice_names_the_size_for_every_rank_and_uint8():
    bud = shm_budget(_env(total=64 * MiB, free=60 * MiB), ranks=1)
    a = shm_advice(4, 2, F32_BATCH, bud)
    need = needed_bytes(4, 2, F32_BATCH.total)
    assert a.shm_size_bytes == need + 4 * MiB  # what others hold stays there
    assert a.docker == "--shm-size=448m" and a.k8s_size_limit == "448Mi"
    text = "\n".join(a.lines())
    assert "docker run --shm-size=448m" in text and "sizeLimit: 448Mi" in text
    assert "uint8" in text and a.uint8_fits is False and a.uint8_live_batches == 4
    two = shm_advice(4, 2, F32_BATCH, shm_budget(_env(), ranks=2, nccl=True))
    assert two.shm_size_bytes == 2 * need + 2 * NCCL_SHM_PER_RANK


def test_measure_batch_counts_float32_apart():
    torch = pytest.importorskip("torch")
    b = measure_batch({"x": torch.zeros(2, 3, dtype=torch.float32),
                       "y": [torch.zeros(4, dtype=torch.uint8)]})
    assert b == BatchBytes(2 * 3 * 4 + 4, 24, tensors=2)


def test_a_missing_dev_shm_is_a_budget_of_zero_not_unknown():
    """No /dev/shm at all (read for real from a path that does not exist): the note, the
    environment's budget and shmfit's agree that no worker batch fits."""
    import dataclasses

    from autotune.environment import read_environment, read_shm

    shm = read_shm("/nonexistent-shmfix-dev-shm")
    assert "budgets allow no worker batches" in (shm.note or "")
    env = dataclasses.replace(read_environment(), shm=shm)
    assert env.shm_budget() == 0
    bud = shm_budget(env, ranks=2)
    assert bud.budget_bytes == 0 and "does not exist" in bud.source
    assert not fits(1, 1, F32_BATCH.as_uint8, bud.budget_bytes)
    assert not fits(1, 1, None, bud.budget_bytes)   # not even an unmeasured batch
    assert fits(0, None, F32_BATCH.total, bud.budget_bytes)


@pytest.mark.alone
def test_oom_group_halves_the_shm_budget_here_for_search_and_loader():
    from autotune.shmfit import OOM_GROUP_DIVISOR, oom_group_divisor

    env = _env()
    env.memory.oom_group = True
    bud = shm_budget(env)
    assert oom_group_divisor(env) == OOM_GROUP_DIVISOR == 2
    assert bud.budget_bytes == 32 * MiB and bud.oom_group and "oom.group" in bud.source
    assert shm_budget(_env()).budget_bytes == 64 * MiB and oom_group_divisor(_env()) == 1
