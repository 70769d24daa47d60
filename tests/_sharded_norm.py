"""Two CPU ranks (gloo) shard a tiny model with FSDP2's fully_shard and write OUT/norms_rank{r}.pt: the package's
gradient norm, the local pieces' norm, and the norm of the same gradient computed unsharded."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_transformer.config import TransformerConfig
from lit_transformer.engine.gradients import gradient_norm
from lit_transformer.model import Transformer


def _model() -> Transformer:
    torch.manual_seed(0)
    return Transformer(TransformerConfig.preset("tiny"))


def _backward(model: Transformer) -> None:
    x = torch.randint(3, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    model(x).square().mean().backward()


def run(rank: int, out: Path, port: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    reference = _model()
    _backward(reference)
    unsharded = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()])

    model = _model()
    mesh = init_device_mesh("cpu", (2,))
    for block in model.decoder_blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    _backward(model)
    local = torch.nn.utils.get_total_norm([p.grad.to_local() for p in model.parameters()])
    trainer = SimpleNamespace(global_step=0, strategy=SimpleNamespace(model=model))
    sharded = gradient_norm(trainer, optimizer)
    torch.save(
        {"unsharded": float(unsharded), "local": float(local), "sharded": float(sharded)}, out / f"norms_rank{rank}.pt"
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free_port = s.getsockname()[1]
    # forked, not spawned: the ranks start with torch and the package imported (this process ran no op, started no
    # thread), not seconds of imports each
    mp.start_processes(run, args=(Path(sys.argv[1]), free_port), nprocs=2, start_method="fork")
