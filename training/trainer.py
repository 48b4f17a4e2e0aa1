"""The trainer: a ResNet-50 embedding under a ranking loss, evaluated on the unseen test classes.

One step = one batch of the configured batch design, one optimiser step. Every ``eval_every``
steps (and at the end) the test split is embedded and Recall@k / NMI / MAP@R are appended to
``metrics.jsonl``; the best Recall@1 is kept as ``best.pt``. ``last.pt`` carries everything a
resume needs (model, optimisers, schedule, sampler position, RNG states), so an interrupted run
continues with exactly the batch it would have drawn next.

RankMI (Algorithm 1 of the paper) alternates: ``critic_steps`` updates of the statistics network
on all pairs of the batch with the embeddings detached, a Newton re-estimate of beta, then one
embedding step with the critic frozen; the critic has its own Adam.

Under ``torchrun`` (WORLD_SIZE > 1) each process embeds a contiguous slice of the same global
batch; the slices are all-gathered (each process keeping the gradient path of its own slice) so
the loss sees the whole batch design, exactly as a single process would.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from nearsight.index.datasets import DatasetSplit, load_dataset
from nearsight.index.embed import embed_paths
from nearsight.index.metrics import evaluate
from nearsight.models.atomic import atomic_file
from nearsight.models.checkpoint import load_checkpoint, save_checkpoint
from nearsight.models.embedding import EmbeddingConfig, EmbeddingNet, build_embedding_net
from nearsight.models.errors import NearsightError
from nearsight.training.config import TrainConfig, load_config
from nearsight.training.data import SeededBatches, SeededTrainDataset, collate
from nearsight.training.losses import build_loss, loss_parameters
from nearsight.training.samplers import build_sampler

log = logging.getLogger(__name__)


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed(device_kind: str) -> DistInfo:
    """Join the process group when launched by torchrun; a no-op for a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return DistInfo(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda":
        if not torch.cuda.is_available():
            raise NearsightError("--device cuda was asked for, but no CUDA device is available")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def gather_with_grad(local: torch.Tensor, info: DistInfo) -> torch.Tensor:
    """All-gather equal-sized slices; this process's own slice keeps its autograd path."""
    if info.world == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(info.world)]
    dist.all_gather(parts, local.detach().contiguous())
    parts[info.rank] = local
    return torch.cat(parts)


def lr_factor(step: int, total: int, config: TrainConfig) -> float:
    """Multiplier of the base learning rates after ``step`` optimiser steps."""
    optim = config.optim
    if optim.warmup_steps and step < optim.warmup_steps:
        return (step + 1) / optim.warmup_steps
    if optim.schedule == "step":
        return optim.gamma ** sum(step >= m for m in optim.milestones)
    if optim.schedule == "cosine":
        span = max(1, total - optim.warmup_steps)
        progress = min(1.0, (step - optim.warmup_steps) / span)
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0


def build_optimizer(model: EmbeddingNet, config: TrainConfig) -> torch.optim.Optimizer:
    """New layers and the pretrained trunk at separate learning rates, as the papers set them."""
    optim = config.optim
    groups = [
        {"params": list(model.trunk_parameters()), "lr": optim.lr, "name": "trunk"},
        {"params": list(model.head_parameters()), "lr": optim.head_lr, "name": "head"},
    ]
    if optim.name == "sgd":
        return torch.optim.SGD(
            groups, lr=optim.lr, momentum=optim.momentum, weight_decay=optim.weight_decay
        )
    cls = torch.optim.AdamW if optim.name == "adamw" else torch.optim.Adam
    return cls(groups, lr=optim.lr, weight_decay=optim.weight_decay)


# models.atomic's temporary names (tempfile: 8 random characters) for the files of a run
_RUN_TEMPORARY = re.compile(
    r"\.(last\.pt|best\.pt|config\.yaml|metrics\.jsonl|train\.jsonl)\.[a-z0-9_]{8}\.tmp"
)


def _line_step(line: str) -> float:
    """The step of a JSON log line; a line cut short by a kill counts as past any step."""
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def sampler_name(config: TrainConfig) -> str:
    """``auto``: the (m,n)-group design for balanced contrastive (its importance weights are
    derived for that design), m-per-class batches for every other loss."""
    if config.sampler.name != "auto":
        return config.sampler.name
    return "group" if config.loss.name == "bcontrastive" else "m_per_class"


def build_train_sampler(config: TrainConfig, labels: list[int]):
    """The batch sampler for ``classes_per_batch`` x ``per_class`` images per batch."""
    design = config.sampler
    name = sampler_name(config)
    images = design.classes_per_batch * design.per_class
    if name == "group":
        kwargs = {"m": design.per_class, "n": design.classes_per_batch}
    elif name == "m_per_class":
        kwargs = {"m": design.per_class, "batch_size": images}
    elif name == "random":
        kwargs = {"batch_pairs": images // 2}
    else:
        kwargs = {}
    kwargs.update(design.params)
    return build_sampler(name, labels, seed=config.seed, **kwargs)


def build_training_loss(config: TrainConfig, sampler: Any) -> nn.Module:
    """The configured loss; the balanced-contrastive importance weights get the training set's
    class counts and the sampler's design unless the config pins them."""
    params = dict(config.loss.params)
    accepted = loss_parameters(config.loss.name)
    if "class_counts" in accepted and "class_counts" not in params:
        params["class_counts"] = sampler.class_counts()
    if "design" in accepted and "design" not in params:
        params.update(
            {k: v for k, v in sampler.design_params().items() if k in accepted and k not in params}
        )
    if "seed" in accepted and "seed" not in params:
        params["seed"] = config.seed
    return build_loss(config.loss.name, **params)


class Trainer:
    """Train, evaluate and checkpoint one run in ``out_dir``."""

    def __init__(self, config: TrainConfig, out_dir: str | Path, *, resume: bool = False):
        self.config = config
        self.out_dir = Path(out_dir)
        self.resume = resume
        self.dist = init_distributed(
            "cuda" if config.device != "cpu" and torch.cuda.is_available() else "cpu"
        )
        self.device = resolve_device(config.device, self.dist.local_rank)
        self.cuda = self.device.type == "cuda"
        self._tb = None

    # -- setup --------------------------------------------------------------------------
    def _prepare_out_dir(self) -> None:
        """Refuse a run folder that cannot take this run (checks only: nothing is written)."""
        last = self.out_dir / "last.pt"
        if self.out_dir.exists() and not self.out_dir.is_dir():
            raise NearsightError(f"--out {self.out_dir} is a file, not a run folder")
        if self.resume:
            if not last.exists():
                raise NearsightError(f"cannot resume: {last} does not exist")
            return
        if last.exists():
            raise NearsightError(
                f"{self.out_dir} already holds a run (last.pt): use --resume to continue it, "
                "or choose another --out"
            )

    def _start_out_dir(self) -> None:
        """Create the run folder and its config.yaml (a new run) once data, model, sampler and
        loss are known to be good, so a run refused for bad input leaves no folder behind; sweep
        the temporaries of a killed run (a resumed one)."""
        if not self.dist.main:
            return
        if not self.resume:
            try:
                self.out_dir.mkdir(parents=True, exist_ok=True)
            except OSError as error:  # a file where a parent folder should be, no permission
                raise NearsightError(f"cannot create {self.out_dir}: {error.strerror}") from None
            with atomic_file(self.out_dir / "config.yaml", "w") as handle:
                handle.write(self.config.dump())
        # a run killed mid-write (SIGKILL, power loss) leaves its temporary file behind: up to
        # a whole checkpoint, hidden, never read; the run that takes over the folder removes it
        for path in self.out_dir.iterdir():
            if _RUN_TEMPORARY.fullmatch(path.name) and path.is_file():
                path.unlink(missing_ok=True)

    def _load_data(self) -> tuple[DatasetSplit, DatasetSplit]:
        data = self.config.data
        train = load_dataset(data.dataset, data.root, "train")
        test = load_dataset(data.dataset, data.root, "test")
        if len(train) == 0 or len(test) == 0:
            raise NearsightError(
                f"dataset {data.dataset} at {data.root} has an empty train or test split"
            )
        return train, test

    def _build_model(self) -> EmbeddingNet:
        model_cfg = self.config.model
        torch.manual_seed(self.config.seed)
        model = build_embedding_net(
            EmbeddingConfig(
                dim=model_cfg.dim,
                pooling=model_cfg.pooling,
                pretrained=model_cfg.pretrained,
                freeze_bn=model_cfg.freeze_bn,
                feature_norm=model_cfg.feature_norm,
                image_size=self.config.data.image_size,
            )
        )
        model.to(self.device)
        if self.cuda and self.config.channels_last:
            model.to(memory_format=torch.channels_last)
        return model

    # -- the run ------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        config = self.config
        self._prepare_out_dir()
        train, test = self._load_data()
        self.test = test
        model = self._build_model()
        self.model = model

        sampler = build_train_sampler(config, train.labels)
        global_batch = sampler.batch_size
        if global_batch % self.dist.world:
            raise NearsightError(
                f"batch size {global_batch} is not divisible by the {self.dist.world} processes"
            )
        batches = SeededBatches(sampler, config.seed)
        dataset = SeededTrainDataset(
            train.samples, config.data.image_size, config.data.crop_scale, config.data.flip
        )
        loss_fn = build_training_loss(config, sampler).to(self.device)
        # RankMI's statistics network (Algorithm 1) has its own optimiser
        critic_optimizer = (
            torch.optim.Adam(
                loss_fn.parameters(),
                lr=config.optim.critic_lr,
                weight_decay=config.optim.critic_weight_decay,
            )
            if hasattr(loss_fn, "critic_loss")
            else None
        )
        optimizer = build_optimizer(model, config)
        self._start_out_dir()
        total_steps = config.steps if config.epochs is None else config.epochs * len(sampler)
        scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: lr_factor(step, total_steps, config)
        )
        train_model: nn.Module = model
        if self.dist.world > 1:
            train_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.cuda else None
            )

        state = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best": -1.0, "best_step": -1}
        if self.resume:
            state = self._load_last(model, optimizer, scheduler, loss_fn, critic_optimizer)
        elif self.dist.main:
            for name in ("metrics.jsonl", "train.jsonl"):
                (self.out_dir / name).unlink(missing_ok=True)

        if critic_optimizer is not None and not self.resume:
            loss_fn.update_beta()  # Algorithm 1, line 2: beta of the initial critic
        if config.eval_at_start and state["step"] == 0 and not self.resume:
            self._evaluate_and_save(state, optimizer, scheduler, loss_fn, critic_optimizer)

        bar = tqdm(
            total=total_steps,
            initial=state["step"],
            desc="train",
            unit="step",
            disable=not (self.dist.main and sys.stderr.isatty()),
            dynamic_ncols=True,
        )
        local = global_batch // self.dist.world
        start_time = time.perf_counter()
        last_log = (time.perf_counter(), state["step"])
        while state["step"] < total_steps:
            batches.set_epoch(state["epoch"], start_batch=state["batch_in_epoch"])
            loader = DataLoader(
                dataset,
                batch_sampler=_RankSlice(batches, self.dist.rank, local),
                num_workers=config.data.workers,
                collate_fn=collate,
                pin_memory=self.cuda,
            )
            finished_epoch = True
            for images, labels in loader:
                loss_value, phase = self._train_step(
                    train_model, loss_fn, optimizer, critic_optimizer, images, labels, state["step"]
                )
                scheduler.step()
                state["step"] += 1
                state["batch_in_epoch"] += 1
                step = state["step"]
                now = time.perf_counter()
                images_per_s = (step - last_log[1]) * global_batch / max(now - last_log[0], 1e-9)
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.4f}", img_s=f"{images_per_s:.1f}")
                if self.dist.main:
                    self._append_train_log(step, loss_value, phase, images_per_s, optimizer)
                if step % config.log_every == 0 or step == total_steps:
                    self._log_scalars(step, loss_value, images_per_s, optimizer, loss_fn)
                    if self.dist.main and not sys.stderr.isatty():
                        print(
                            f"step {step}/{total_steps} loss {loss_value:.4f} "
                            f"{images_per_s:.1f} img/s",
                            file=sys.stderr,
                            flush=True,
                        )
                    last_log = (now, step)
                if step < total_steps and self._time_is_up(start_time):
                    total_steps = step  # the time limit ends the run here, with its evaluation
                    print(
                        f"time limit of {config.time_limit_s:g}s reached after {step} steps",
                        file=sys.stderr,
                    )
                evaluate_now = step % config.eval_every == 0 or step == total_steps
                if evaluate_now:
                    self._evaluate_and_save(state, optimizer, scheduler, loss_fn, critic_optimizer)
                elif step % config.save_every == 0:
                    self._save_last(state, optimizer, scheduler, loss_fn, critic_optimizer)
                if step >= total_steps:
                    finished_epoch = state["batch_in_epoch"] >= len(sampler)
                    break
            if finished_epoch:
                state["epoch"] += 1
                state["batch_in_epoch"] = 0
        bar.close()
        if self._tb is not None:
            self._tb.close()
        summary = {
            "steps": state["step"],
            "best_recall@1": state["best"],
            "best_step": state["best_step"],
            "seconds": time.perf_counter() - start_time,
            "last": self.last_metrics,
        }
        if self.dist.world > 1:
            dist.barrier()
        return summary

    def _train_step(
        self,
        model: nn.Module,
        loss_fn: nn.Module,
        optimizer: torch.optim.Optimizer,
        critic_optimizer: torch.optim.Optimizer | None,
        images: torch.Tensor,
        labels: torch.Tensor,
        batch_index: int,
    ) -> tuple[float, str]:
        """One batch: an embedding step, or for RankMI a critic step when Algorithm 1 says so
        (batch t updates the statistics network when t mod (k+1) != 0). Returns the loss value
        and the phase ("embedding" or "critic")."""
        model.train()
        images = images.to(self.device, non_blocking=True)
        if self.cuda and self.config.channels_last:
            images = images.contiguous(memory_format=torch.channels_last)
        labels = labels.to(self.device)
        critic_phase = critic_optimizer is not None and loss_fn.is_critic_step(batch_index)
        grad = contextlib.nullcontext() if not critic_phase else torch.no_grad()
        with grad, self._autocast():
            local_embeddings = model(images)
        embeddings = gather_with_grad(local_embeddings.float(), self.dist)
        all_labels = gather_with_grad(labels, self.dist)
        if critic_phase:
            # all pairs of the batch, embeddings detached; then beta by Newton (lines 9-15)
            critic_optimizer.zero_grad(set_to_none=True)
            critic_loss = loss_fn.critic_loss(embeddings.detach(), all_labels)
            critic_loss.backward()
            critic_optimizer.step()
            loss_fn.update_beta()
            return float(critic_loss.detach()), "critic"
        loss = loss_fn(embeddings, all_labels)
        optimizer.zero_grad(set_to_none=True)
        # DDP averages gradients over processes; each process's backward only reaches its own
        # slice of the global batch, so scaling by the world size gives the full-batch gradient.
        (loss * self.dist.world).backward()
        optimizer.step()
        return float(loss.detach()), "embedding"

    def _time_is_up(self, start_time: float) -> bool:
        """Whether ``time_limit_s`` has passed; every process follows process 0's clock."""
        if self.config.time_limit_s is None:
            return False
        up = time.perf_counter() - start_time >= self.config.time_limit_s
        if self.dist.world > 1:
            flag = torch.tensor([int(up)], device=self.device if self.cuda else "cpu")
            dist.broadcast(flag, src=0)
            up = bool(flag.item())
        return up

    def _autocast(self):
        if self.cuda and self.config.amp:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    # -- evaluation and checkpoints -----------------------------------------------------
    @torch.no_grad()
    def evaluate_model(self, model: EmbeddingNet) -> dict[str, Any]:
        """Embed the test split with the test transform and compute the retrieval metrics."""
        model.eval()

        def embed(images: torch.Tensor) -> torch.Tensor:
            with self._autocast():
                return model(torch.from_numpy(images).to(self.device)).float()

        result = embed_paths(
            embed,
            [s.path for s in self.test.samples],
            image_size=self.config.data.image_size,
            resize=self.config.data.resize,
            batch_size=self.config.data.eval_batch_size,
            workers=self.config.data.workers,
            desc="evaluate",
        )
        for error in result.errors:
            log.warning("skipped in evaluation: %s", error)
        labels = torch.tensor(self.test.labels).numpy()[result.ok]
        return evaluate(result.embeddings, labels, ks=tuple(self.config.ks))

    def _evaluate_and_save(self, state, optimizer, scheduler, loss_fn, critic_optimizer) -> None:
        if self.dist.main:
            metrics = self.evaluate_model(self.model)
            self.last_metrics = metrics
            record = {"step": state["step"], "epoch": state["epoch"], **metrics}
            with open(self.out_dir / "metrics.jsonl", "a") as handle:
                handle.write(json.dumps(record) + "\n")
            if self._tb_writer() is not None:
                for key, value in metrics.items():
                    if key != "queries":
                        self._tb.add_scalar(f"eval/{key}", value, state["step"])
            recall1 = metrics.get("recall@1", 0.0)
            print(
                f"eval step {state['step']}: "
                + " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k != "queries"),
                file=sys.stderr,
                flush=True,
            )
            if recall1 > state["best"]:
                state["best"], state["best_step"] = recall1, state["step"]
                save_checkpoint(
                    self.out_dir / "best.pt", self.model, extra=self._model_extra(state, metrics)
                )
        self._save_last(state, optimizer, scheduler, loss_fn, critic_optimizer)

    def _model_extra(self, state: dict, metrics: dict | None) -> dict[str, Any]:
        return {
            "training": {
                "loss": self.config.loss.name,
                "dataset": self.config.data.dataset,
                "step": state["step"],
                "metrics": metrics or {},
                "config": self.config.to_dict(),
            }
        }

    def _save_last(self, state, optimizer, scheduler, loss_fn, critic_optimizer) -> None:
        if not self.dist.main:
            return
        extra = self._model_extra(state, None)
        extra.update(
            {
                "state": dict(state),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "loss_state": loss_fn.state_dict(),
                "critic_optimizer": critic_optimizer.state_dict() if critic_optimizer else None,
                "rng": {"torch": torch.get_rng_state()},
            }
        )
        save_checkpoint(self.out_dir / "last.pt", self.model, extra=extra)

    def _load_last(self, model, optimizer, scheduler, loss_fn, critic_optimizer) -> dict:
        checkpoint = load_checkpoint(self.out_dir / "last.pt", map_location=self.device)
        model.load_state_dict(checkpoint["state_dict"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scheduler.load_state_dict(checkpoint["scheduler"])
        loss_fn.load_state_dict(checkpoint["loss_state"])
        if critic_optimizer is not None and checkpoint.get("critic_optimizer"):
            critic_optimizer.load_state_dict(checkpoint["critic_optimizer"])
        torch.set_rng_state(checkpoint["rng"]["torch"].cpu())
        state = dict(checkpoint["state"])
        if self.dist.main:
            self._truncate_metrics(state["step"])
        print(f"resumed from {self.out_dir / 'last.pt'} at step {state['step']}", file=sys.stderr)
        return state

    def _truncate_metrics(self, step: int) -> None:
        """A run killed after writing log lines but before its next last.pt repeats those
        steps on resume: drop lines past the resumed step so none appears twice."""
        for name in ("metrics.jsonl", "train.jsonl"):
            path = self.out_dir / name
            if not path.exists():
                continue
            lines = [line for line in path.read_text().splitlines() if line.strip()]
            kept = [line for line in lines if _line_step(line) <= step]
            if len(kept) != len(lines):
                with atomic_file(path, "w") as handle:
                    handle.write("".join(line + "\n" for line in kept))

    def _append_train_log(self, step, loss_value, phase, images_per_s, optimizer) -> None:
        """``train.jsonl``: the loss curve, one line per step (the TensorBoard events hold the
        same in a binary form)."""
        record = {"step": step, "loss": loss_value, "images_per_s": round(images_per_s, 2)}
        if phase != "embedding":
            record["phase"] = phase
        record.update(
            {f"lr_{g.get('name', i)}": g["lr"] for i, g in enumerate(optimizer.param_groups)}
        )
        with open(self.out_dir / "train.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")

    def _tb_writer(self):
        if self._tb is None and self.dist.main:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is a dependency, but logging must never kill a run
                return None
            self._tb = SummaryWriter(str(self.out_dir / "tensorboard"))
        return self._tb

    def _log_scalars(self, step, loss_value, images_per_s, optimizer, loss_fn) -> None:
        writer = self._tb_writer()
        if writer is None:
            return
        writer.add_scalar("train/loss", loss_value, step)
        writer.add_scalar("train/images_per_s", images_per_s, step)
        for group in optimizer.param_groups:
            writer.add_scalar(f"lr/{group.get('name', 'group')}", group["lr"], step)
        if hasattr(loss_fn, "beta"):
            writer.add_scalar("train/rankmi_beta", float(loss_fn.beta), step)

    last_metrics: dict[str, Any] | None = None


class _RankSlice:
    """This process's contiguous slice of each global batch (the whole batch for one process)."""

    def __init__(self, batches: SeededBatches, rank: int, local: int):
        self.batches, self.rank, self.local = batches, rank, local

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        for batch in self.batches:
            yield batch[self.rank * self.local : (self.rank + 1) * self.local]


def train(config: TrainConfig, out_dir: str | Path, *, resume: bool = False) -> dict[str, Any]:
    """Train one run; see :class:`Trainer`."""
    return Trainer(config, out_dir, resume=resume).run()


def resume_config(out_dir: str | Path) -> TrainConfig:
    """The resolved configuration a run saved, for ``--resume``."""
    path = Path(out_dir) / "config.yaml"
    if not path.exists():
        raise NearsightError(f"cannot resume: {path} does not exist")
    return load_config(path)
