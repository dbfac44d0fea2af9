"""Resolved run configurations for tests: the product's own parser and resolver, a tiny model."""
from pretrain_cli.config.parser import parse_config
from pretrain_cli.config.presets import resolve_model_dir
from pretrain_cli.config.resolve import resolve
from pretrain_cli.run_config import Target
from pretrain_cli.models.config import ModelConfig

BASE = ["--output_dir", "o", "--input_dir", "d", "--do_train", "--max_steps", "5", "--device", "cpu"]


def model_config(name: str = "micro-qwen2") -> ModelConfig:
    return ModelConfig.from_file(str(resolve_model_dir(name)))


def resolve_run(*overrides: str, world: int = 1, rank: int = 0, device: str = "cpu", gpu_name=None,
                model: str = "micro-qwen2", base=BASE):
    """RunConfig for BASE + overrides on `world` processes of `device`."""
    args = parse_config(None, [*base, *overrides])
    return resolve(args, model_config(model), Target(device, world, rank, 0, gpu_name))
