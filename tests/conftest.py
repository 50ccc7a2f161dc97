import os

# CPU tests run on CPU + gloo even where a GPU is visible (entrain.runtime.distributed.choose_device);
# a GPU test asks for CUDA itself (monkeypatch.setenv("ENTRAIN_DEVICE", "cuda"), or run with it set)
os.environ.setdefault("ENTRAIN_DEVICE", "cpu")

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    max_examples=60,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "ci"))
