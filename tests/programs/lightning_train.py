"""An ordinary PyTorch Lightning program, written for Slurm, knowing nothing of hpclaunch:
Lightning detects the cluster environment itself. Writes <out>/lightning-<rank>.json."""

import json
import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    out, nodes, devices = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=nodes,
        strategy="ddp",
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=8))
    env = trainer.strategy.cluster_environment
    record = {
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "node_rank": trainer.node_rank,
        "local_rank": trainer.local_rank,
        "environment": type(env).__name__,
        "weight": trainer.lightning_module.layer.weight.detach().flatten().tolist(),
    }
    with open(os.path.join(out, f"lightning-{trainer.global_rank}.json"), "w") as handle:
        json.dump(record, handle)
    # Leave together: torch 2.13's gloo group, left for interpreter exit, can abort a rank
    # ("terminate called without an active exception") once rank 0 and its store are gone.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
