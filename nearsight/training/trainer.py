"""The training loop: a ResNet-50 embedding under a ranking loss, evaluated on held-out classes.

A step is one update of the embedding network from one batch of the configured batch design.
For RankMI (Algorithm 1 of the paper) ``critic_steps`` batches that update only the statistics
network (embeddings detached, then a Newton re-estimate of beta) come between two steps; they
are batches, not steps: ``steps``, the schedule, ``eval_every`` and ``save_every`` count
embedding updates only. The learning rate follows ``nearsight/training/schedule.py`` over the steps and
the training seconds used (evaluations excluded).

Every ``eval_every`` steps (and at the end) the test split, and the validation classes when
``data.val_classes`` holds some out, are embedded and their Recall@k / NMI / MAP@R appended to
``metrics.jsonl`` (validation keys prefixed ``val/``); ``best.pt`` keeps the checkpoint with the
best validation Recall@1 (test Recall@1 without a validation split). ``last.pt`` carries
everything a resume needs (model, optimisers, schedule position and training seconds, sampler
position, RNG states), so an interrupted run continues with exactly the batch and the learning
rate it would have had next. One batch's update (forward, loss, backward, optimiser; or the
critic's): nearsight/training/batch_update.py.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from nearsight.core.errors import NearsightError
from nearsight.data.datasets import DatasetSplit, load_dataset
from nearsight.models.hardware import resolve_fast_math
from nearsight.models.trunks import trunk_family
from nearsight.training.batch_update import BatchUpdate, as_critic
from nearsight.training.builders import (
    build_critic_optimizer,
    build_model,
    build_optimizer,
    build_train_sampler,
    build_training_loss,
    embedding_config,
)
from nearsight.training.compiled import CompiledStep, resolve_compile
from nearsight.training.config import TrainConfig
from nearsight.training.data import SeededBatches, SeededTrainDataset, collate, hold_out_classes
from nearsight.training.distributed import (
    CPU_FALLBACK_NOTE,
    RankSlice,
    agree,
    barrier,
    cuda_available,
    init_distributed,
    resolve_device,
)
from nearsight.training.evaluation import EvalSplit
from nearsight.training.loss_roles import CriticLoss
from nearsight.training.progress import TrainProgress
from nearsight.training.resume import TrainState, load_last, model_extra, save_last
from nearsight.training.run_files import RunFiles
from nearsight.training.schedule import LRSchedule, set_learning_rates
from nearsight.training.step_io import DeviceBatches
from nearsight.training.step_logs import StepLogs
from nearsight.training.thread_probe import cpu_threads

log = logging.getLogger(__name__)
clock = time.perf_counter  # the training-time clock (tests replace it with a fake one)

# --pretrained auto without ImageNet weights at hand (nothing is downloaded at run time)


class Trainer:
    """Train, evaluate and checkpoint one run in ``out_dir``."""

    def __init__(self, config: TrainConfig, out_dir: str | Path, *, resume: bool = False):
        self.config = config
        self.resume = resume
        self.dist = init_distributed(
            "cuda" if config.device != "cpu" and cuda_available() else "cpu"
        )
        # the CPU note waits for the data to load: bad input stays one error line
        self.device = resolve_device(config.device, self.dist.local_rank, note=False)
        self.cuda = self.device.type == "cuda"
        self.files = RunFiles(out_dir, main=self.dist.main)
        self.logs: StepLogs | None = None

    # -- setup --------------------------------------------------------------------------
    def _load_data(self) -> tuple[DatasetSplit, DatasetSplit | None, DatasetSplit]:
        data = self.config.data
        train = load_dataset(data.dataset, data.root, "train")
        test = load_dataset(data.dataset, data.root, "test")
        train.require_labels(), test.require_labels()
        if len(train) == 0 or len(test) == 0:
            raise NearsightError(
                f"dataset {data.dataset} at {data.root} has an empty train or test split"
            )
        train, val = hold_out_classes(train, data.val_classes, self.config.seed)
        return train, val, test

    def _setup(self) -> None:
        config = self.config
        self.files.check(self.resume)
        train, val, test = self._load_data()
        if config.device == "auto" and not self.cuda and self.dist.local_rank == 0:
            print(CPU_FALLBACK_NOTE, file=sys.stderr)
        scratch_by_auto = "model.pretrained" in config.auto and config.model.pretrained == "none"
        if scratch_by_auto and self.dist.main:
            print(self._scratch_note(), file=sys.stderr)
        # the trunk's pretrained resize (bicubic for most timm trunks): training and evaluation
        interpolation = embedding_config(config).interpolation
        self.test = EvalSplit(test, config, interpolation)
        self.val = EvalSplit(val, config, interpolation) if val is not None else None
        self.model = build_model(config, self.device)
        self.amp, self.channels_last, chosen = resolve_fast_math(
            config.amp, config.channels_last, cuda=self.cuda
        )
        self.precision = chosen  # what runs, for the run's result (reproduce reports it)
        if self.channels_last:
            self.model.to(memory_format=torch.channels_last)
        if self.dist.main:
            print(f"precision: {chosen}", file=sys.stderr)
        self.thread_probe = cpu_threads(config.cpu_threads, cuda=self.cuda, world=self.dist.world)
        self.sampler = build_train_sampler(config, train.require_labels())
        if self.sampler.batch_size % self.dist.world:
            raise NearsightError(
                f"batch size {self.sampler.batch_size} is not divisible by the "
                f"{self.dist.world} processes"
            )
        self.batches = SeededBatches(self.sampler, config.seed)
        self.dataset = SeededTrainDataset(
            train.samples,
            config.data.image_size,
            config.data.crop_scale,
            config.data.flip,
            cache=config.data.cache_images,
            interpolation=interpolation,
        )
        self.loss_fn = build_training_loss(config, self.sampler).to(self.device)
        self.critic_optimizer = build_critic_optimizer(self.loss_fn, config)
        self.optimizer = build_optimizer(self.model, self.loss_fn, config)
        self.total_batches, self.total_steps = self._length()
        self.schedule = LRSchedule.from_config(config, self.total_steps)
        self.train_model: nn.Module = self.model
        if self.dist.world > 1:
            self.train_model = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.cuda else None
            )
        mode = resolve_compile(config.compile, cuda=self.cuda, world=self.dist.world)
        self.step = CompiledStep(self.train_model, self.loss_fn, mode)
        self.update = BatchUpdate(
            self.model,
            self.train_model,
            self.step,
            self.loss_fn,
            self.optimizer,
            self.critic_optimizer,
            self.dist,
            self.device,
            self.channels_last,
            self.amp,
            multi_head=len(config.model.heads) > 1,
            clip_grad_value=config.optim.clip_grad_value,
        )
        self.files.start(config.dump(), self.resume)

    def _scratch_note(self) -> str:
        arch = self.config.model.arch
        return trunk_family(arch).scratch_note(arch)

    def _is_critic_batch(self, batch: int) -> bool:
        return self.critic_optimizer is not None and self._critic().is_critic_step(batch)

    def _critic(self) -> CriticLoss:
        return as_critic(self.loss_fn)

    def _length(self) -> tuple[int | None, int | None]:
        """(batches, steps) the run lasts by its step or epoch budget; None for time only."""
        if self.config.epochs is not None:
            batches = self.config.epochs * len(self.sampler)
            return batches, sum(not self._is_critic_batch(b) for b in range(batches))
        return None, self.config.steps

    # -- the run ------------------------------------------------------------------------
    def run(self) -> TrainState:
        self._setup()
        config, state = self.config, TrainState()
        if self.resume:
            state = self._load_last()
        else:
            if self.critic_optimizer is not None:
                self._critic().update_beta()  # Algorithm 1, line 2: beta of the initial critic
            if config.eval_at_start:
                self._evaluate_and_save(state)
        self.progress = TrainProgress(
            total_steps=self.total_steps,
            initial=state.step,
            initial_seconds=state.train_seconds,
            time_limit_s=config.time_limit_s,
            expected_steps_per_s=config.expected_steps_per_s,
            enabled=self.dist.main,
        )
        self.logs = StepLogs(
            self.files,
            self.progress,
            self.optimizer,
            self.loss_fn,
            batch_size=self.sampler.batch_size,
            log_every=config.log_every,
            device=self.device,
        )
        while not self._finished(state):
            self.train_one_epoch(state)
        self._flush_logs()
        self.progress.close()
        self.files.close()
        barrier(self.dist)
        return state

    def _budget_done(self, state: TrainState) -> bool:
        """Whether the run's steps (or epochs' batches) are all done."""
        if self.total_batches is not None:
            return state.batch >= self.total_batches
        return self.total_steps is not None and state.step >= self.total_steps

    def _finished(self, state: TrainState) -> bool:
        return self._budget_done(state) or self._time_is_up(state)

    def _time_is_up(self, state: TrainState) -> bool:
        """Whether ``time_limit_s`` of training time is used; every process follows process 0."""
        limit = self.config.time_limit_s
        return limit is not None and agree(state.train_seconds >= limit, self.dist, self.device)

    def train_one_epoch(self, state: TrainState) -> None:
        """Batches from the sampler's current epoch (from where a resumed run left it) until
        the epoch or the run ends; evaluates and checkpoints on the way."""
        config = self.config
        self.batches.set_epoch(state.epoch, start_batch=state.batch_in_epoch)
        local = self.sampler.batch_size // self.dist.world
        logs = self.logs
        assert logs is not None, "run() starts the step logs before any epoch"
        loader = DataLoader(
            self.dataset,
            batch_sampler=RankSlice(self.batches, self.dist.rank, local),
            num_workers=config.data.workers,
            collate_fn=collate,
            pin_memory=self.cuda,
        )
        started = clock()
        for images, labels in DeviceBatches(loader, self.device, self.channels_last):
            elapsed = state.train_seconds + clock() - started
            critic = self._is_critic_batch(state.batch)
            if not critic:
                set_learning_rates(self.optimizer, self.schedule.factor(state.step, elapsed))
            freeze_trunk = state.step < config.optim.freeze_trunk_steps
            if self.thread_probe is not None:
                self.thread_probe.before_step(state.step)
            loss = self._train_step(images, labels, critic, state.batch, freeze_trunk)
            logs.settle()  # CUDA: the previous batch is done, so its time is counted
            state.batch += 1
            state.batch_in_epoch += 1
            state.step += 0 if critic else 1
            now = clock()
            batch_seconds = now - started
            state.train_seconds += batch_seconds
            if self.thread_probe is not None:
                self.thread_probe.after_step(state.step, batch_seconds)
            logs.push(
                loss,
                step=state.step,
                batch=state.batch,
                train_seconds=state.train_seconds,
                seconds=batch_seconds,
                critic=critic,
            )
            # the time limit ends a run after an update of the embedding, never a critic batch
            time_up = not critic and self._time_is_up(state)
            done = self._budget_done(state) or time_up
            if time_up and not self._budget_done(state):
                print(
                    f"time limit of {config.time_limit_s:g}s reached after {state.step} steps",
                    file=sys.stderr,
                )
            if done or (not critic and state.step % config.eval_every == 0):
                self._evaluate_and_save(state)  # every run ends with an evaluation
            elif not critic and state.step % config.save_every == 0:
                self._save_last(state)
            if done:
                break
            started = clock()  # evaluations and saves do not count as training time
        else:
            state.epoch += 1
            state.batch_in_epoch = 0

    def _train_step(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        critic: bool,
        batch: int,
        freeze_trunk: bool = False,
    ) -> torch.Tensor:
        """One batch: an update of the embedding network or, for RankMI when Algorithm 1 says
        so (batch t updates the statistics network when t mod (k+1) != 0), of the critic.
        Returns the batch's loss, on the device (read back later: no host sync here)."""
        return self.step.guarded(
            lambda: self.update(images, labels, critic, freeze_trunk), kind=critic
        )

    # -- evaluation and checkpoints -----------------------------------------------------
    @property
    def selection_metric(self) -> str:
        """What best.pt is chosen by: validation Recall@1 when classes are held out, else test
        Recall@1 (optimistic; Proxy Anchor's code chooses so); best.pt's ``selected_by`` says
        which."""
        return "val/recall@1" if self.val is not None else "test/recall@1"

    def _flush_logs(self) -> None:
        """Every queued batch record written: train.jsonl is whole at a checkpoint."""
        if self.logs is not None:
            self.logs.flush(wait_all=True)

    def _evaluate_and_save(self, state: TrainState) -> None:
        self._flush_logs()
        # in fp32, as the exported ONNX model runs: best.pt is chosen by the numbers its gallery
        # will show (bf16 rounding flips near-ties on small sets)
        if self.dist.main:
            metrics = self.test.evaluate(self.model, self.device)
            state.last_metrics = metrics
            record: dict[str, Any] = dict(metrics)
            if self.val is not None:
                val = self.val.evaluate(self.model, self.device)
                record.update({f"val/{k}": v for k, v in val.items()})
            self.files.append_metrics(
                {"step": state.step, "batch": state.batch, "epoch": state.epoch, **record}
            )
            shown = {k: v for k, v in record.items() if not k.endswith("queries")}
            self.files.scalars({f"eval/{k}": v for k, v in shown.items()}, state.step)
            print(
                f"eval step {state.step}: " + " ".join(f"{k} {v:.4f}" for k, v in shown.items()),
                file=sys.stderr,
                flush=True,
            )
            score = record.get(self.selection_metric.removeprefix("test/"), 0.0)
            if score > state.best:
                state.best, state.best_step, state.best_metrics = score, state.step, metrics
                self.files.save_best(self.model, self._model_extra(state, record))
        self._save_last(state)

    def _model_extra(self, state: TrainState, metrics: dict | None) -> dict[str, Any]:
        return model_extra(self.config, state, metrics, self.selection_metric)

    def _save_last(self, state: TrainState) -> None:
        self._flush_logs()
        if self.dist.main:
            save_last(self, state)

    def _load_last(self) -> TrainState:
        return load_last(self)
