"""Model specs, weights and the reference round."""
from conjugate.models.presets import PRESETS
from conjugate.models.reference import (KVCache, RoundInputs, RoundOutputs, forward, make_round_inputs,
                                        reference_round)
from conjugate.models.spec import FAMILIES, ModelSpec, RopeScaling
from conjugate.models.weights import DTYPES, LayerWeights, ModelWeights, load_checkpoint, random_weights

__all__ = ["PRESETS", "FAMILIES", "DTYPES", "KVCache", "LayerWeights", "ModelSpec", "ModelWeights", "RopeScaling",
           "RoundInputs", "RoundOutputs", "forward", "load_checkpoint", "make_round_inputs", "random_weights",
           "reference_round"]
