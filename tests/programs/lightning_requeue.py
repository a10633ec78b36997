"""A tiny PyTorch Lightning program left to Lightning's own SLURMEnvironment requeue
(auto_requeue, SIGUSR1): on the signal Lightning saves hpc_ckpt_N.ckpt in default_root_dir
and runs `scontrol requeue` from rank 0; the next attempt restores that checkpoint.

Each step sleeps STEP_S (default 0.25 s) on the first attempt, so that the signal comes
mid-training, and not at all once resumed (HPCLAUNCH_ATTEMPT > 0), so that the second
attempt reaches max_steps before its own signal. Prints, per attempt: the SIGUSR1
handler Lightning installed, the step it started from, the checkpoint it restored, the
step it ended at."""

import os
import signal
import time

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

MAX_STEPS = int(os.environ.get("MAX_STEPS", "400"))
ATTEMPT = os.environ.get("HPCLAUNCH_ATTEMPT", "?")
STEP_S = float(os.environ.get("STEP_S", "0.25")) if ATTEMPT in ("0", "?") else 0.0
DEVICES = int(os.environ.get("DEVICES", "1"))  # ranks on the one node: 2 for DDP (gloo)


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        time.sleep(STEP_S)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_start(self) -> None:
        handler = signal.getsignal(signal.SIGUSR1)
        print(
            f"rank {self.global_rank} attempt {ATTEMPT}: SIGUSR1 handler {type(handler).__name__}; "
            f"restart count {os.environ.get('SLURM_RESTART_COUNT', '0')}; "
            f"from step {self.trainer.global_step}; restored {self.trainer.ckpt_path}",
            flush=True,
        )

    def on_train_end(self) -> None:
        print(
            f"rank {self.global_rank} attempt {ATTEMPT}: ended at step {self.trainer.global_step}",
            flush=True,
        )


def main() -> None:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    trainer = L.Trainer(
        default_root_dir=os.environ["HPCLAUNCH_CHECKPOINT_DIR"],
        accelerator="cpu",
        devices=DEVICES,
        num_nodes=1,
        strategy="ddp" if DEVICES > 1 else "auto",
        max_steps=MAX_STEPS,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(), DataLoader(data, batch_size=8))
    # Leave together (see lightning_train.py): a gloo group left to interpreter exit can
    # abort a rank once rank 0 and its store are gone.
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
