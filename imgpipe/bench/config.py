"""What a bench run measures: the data, the ranks, the (backend, workers) sweep, the compute, and the trainer config behind it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from imgpipe.errors import ConfigError
from imgpipe.storage.source import is_url

if TYPE_CHECKING:
    from imgpipe.train.config import TrainConfig

BACKENDS = ("torch", "dali")


@dataclass(frozen=True)
class BenchConfig:
    """What to run. ``backends`` and ``workers`` are swept; every pair is one run.

    ``train_config_path``, ``train_recipe`` and ``train_overrides`` (``section.key=value``) are a
    trainer config, as ``imgpipe train --config/--recipe/--set`` take: the bench's model and loaders
    run with its options (``train.amp``, ``train.channels_last``, ...); see :meth:`train_config`.
    ``image_size`` None: the size that config trains its first epoch at (:attr:`train_size`).
    """

    data: str
    split: str = "train"
    gpus: int = 0
    nproc: int = 1
    backends: tuple[str, ...] = ("torch",)
    workers: tuple[int, ...] = (2,)
    steps: int = 20
    warmup: int = 2
    batch_size: int = 32
    image_size: int | None = None
    model: str | None = None
    compute_ms: float = 0.0
    cold: bool = False
    seed: int = 0
    train_config_path: str | None = None
    train_overrides: tuple[str, ...] = ()
    train_recipe: str | None = None

    @property
    def ranks(self) -> int:
        return self.gpus if self.gpus else self.nproc

    def check(self) -> None:
        """Raise ConfigError naming the first invalid option."""
        if self.gpus < 0:
            raise ConfigError(f"--gpus must be >= 0 (got {self.gpus})")
        if self.nproc < 1:
            raise ConfigError(f"--nproc must be >= 1 (got {self.nproc})")
        if self.gpus and self.nproc not in (1, self.gpus):
            raise ConfigError(f"--nproc {self.nproc} differs from --gpus {self.gpus}: one rank per GPU; give only --gpus")
        if not self.backends or any(b not in BACKENDS for b in self.backends):
            raise ConfigError(f"--backend must be torch, dali or all (got {','.join(self.backends)})")
        if not self.workers or any(w < 0 for w in self.workers):
            raise ConfigError(f"--workers must be counts >= 0, e.g. 1,2,4 (got {','.join(map(str, self.workers))})")
        for option, value, least in (
            ("--steps", self.steps, 1),
            ("--warmup", self.warmup, 0),
            ("--batch-size", self.batch_size, 1),
            ("--image-size", self.train_size, 8),
        ):
            if value < least:
                raise ConfigError(f"{option} must be >= {least} (got {value})")
        if self.cold and is_url(self.data):
            raise ConfigError(f"--cold evicts DATA from this machine's page cache; {self.data} is a URL, read over the network every time")
        if self.model and self.compute_ms:
            raise ConfigError("give --model NAME or --compute-ms T, not both")
        if self.model:
            from imgpipe.train.models import check_model_name

            check_model_name(self.model, "--model")
        if self.compute_ms < 0:
            raise ConfigError(f"--compute-ms must be >= 0 (got {self.compute_ms})")
        self.train_config()

    @property
    def train_size(self) -> int:
        """The image size measured: ``image_size``, else the trainer config's first training size (its
        data.resolution's, or data.image_size: 224 without a config)."""
        if self.image_size is not None:
            return self.image_size
        from imgpipe.train.config import load_config
        from imgpipe.train.resolution import parse_resolution

        train = load_config(self.train_config_path, self.train_overrides, recipe=self.train_recipe)
        return parse_resolution(train.data.resolution, train.data.image_size).at(0)

    def train_config(self, workers: int | None = None, device: Any = None) -> TrainConfig:
        """The trainer's config this bench runs as: ``train_config_path``, ``train_recipe`` and ``train_overrides``,
        then the bench's own options (data, split, image size (one, no ramp), batch size, seed, model, ``workers``);
        with a ``device``, ``auto`` precision and memory format resolved for it as the trainer resolves them."""
        from imgpipe.train.config import load_config
        from imgpipe.train.precision import resolve_auto

        train = load_config(self.train_config_path, self.train_overrides, recipe=self.train_recipe)
        train.data.path, train.data.train_split, train.data.image_size, train.data.workers = self.data, self.split, self.train_size, workers
        train.data.resolution = None
        train.train.batch_size, train.train.seed = self.batch_size, self.seed
        if self.model:
            train.model.name = self.model
        return train if device is None else resolve_auto(train, device)

    def with_trainer_model(self) -> BenchConfig:
        """With a recipe and neither ``model`` nor ``compute_ms``: this config running the trainer config's
        model (recipe < config < ``--set``, as ``imgpipe train`` resolves it); else this config."""
        if not self.train_recipe or self.model or self.compute_ms:
            return self
        return replace(self, model=self.train_config().model.name)
