"""DP-SGD on PyTorch (optional extra ``renyi[torch]``): per-example gradients, clipping, noise.

Importing this package needs ``torch``; ``import renyi`` does not.
"""

from renyi.dpsgd.adaptive import AdaptiveClipDPOptimizer, adaptive_noise_multiplier
from renyi.dpsgd.clipping import ClippedGradientEngine, clipping_weights
from renyi.dpsgd.correlated import (
    CorrelatedOptimizer,
    CyclicPoissonSampler,
    make_private_correlated,
)
from renyi.dpsgd.data import DatasetNotFoundError, load_digits, load_fashion_mnist
from renyi.dpsgd.engine import (
    BatchMemoryManager,
    GradSampleModule,
    PrivacyEngine,
    ShuffledBatchesWarning,
)
from renyi.dpsgd.ghost import GHOST_LAYER_TYPES, supports_ghost
from renyi.dpsgd.grad_sample import (
    NonFiniteGradientError,
    UnsupportedModelError,
    check_model,
    per_example_grads,
)
from renyi.dpsgd.independence import ExampleMixingError
from renyi.dpsgd.optimizer import (
    DPOptimizer,
    NonFiniteLossError,
    PlanExceededError,
    UnclippedGradientError,
)
from renyi.dpsgd.privacy import (
    EmptyBatchCollate,
    PlanCompleteWarning,
    PrivateTraining,
    calibrate_sampler_noise,
    make_private,
    private_data_loader,
)
from renyi.dpsgd.registry import register_grad_sampler, unregister_grad_sampler
from renyi.dpsgd.sampler import (
    BallsInBinsSampler,
    FixedSizeSampler,
    PoissonSampler,
    SecureRandomSource,
    SeededRandomSource,
    ShuffleSampler,
    TruncatedPoissonSampler,
)
from renyi.dpsgd.trainer import Trainer, TrainHistory, evaluate

__all__ = [
    "GHOST_LAYER_TYPES",
    "AdaptiveClipDPOptimizer",
    "BallsInBinsSampler",
    "BatchMemoryManager",
    "ClippedGradientEngine",
    "CorrelatedOptimizer",
    "CyclicPoissonSampler",
    "DPOptimizer",
    "DatasetNotFoundError",
    "EmptyBatchCollate",
    "ExampleMixingError",
    "FixedSizeSampler",
    "GradSampleModule",
    "NonFiniteGradientError",
    "NonFiniteLossError",
    "PlanCompleteWarning",
    "PlanExceededError",
    "PoissonSampler",
    "PrivacyEngine",
    "PrivateTraining",
    "SecureRandomSource",
    "SeededRandomSource",
    "ShuffleSampler",
    "ShuffledBatchesWarning",
    "TrainHistory",
    "Trainer",
    "TruncatedPoissonSampler",
    "UnclippedGradientError",
    "UnsupportedModelError",
    "adaptive_noise_multiplier",
    "calibrate_sampler_noise",
    "check_model",
    "clipping_weights",
    "evaluate",
    "load_digits",
    "load_fashion_mnist",
    "make_private",
    "make_private_correlated",
    "per_example_grads",
    "private_data_loader",
    "register_grad_sampler",
    "supports_ghost",
    "unregister_grad_sampler",
]
