"""Fixtures shared by every test area.

S3 fixtures (`moto_endpoint`, `s3_bucket`, `fault_proxy`) come from s3_server.py: a real S3 HTTP
API (moto) on 127.0.0.1, never a mock of fsspec.
"""

try:
    from s3_server import fault_proxy, moto_endpoint, s3_bucket
except ImportError:  # tests/ imported as a package
    from tests.s3_server import fault_proxy, moto_endpoint, s3_bucket

__all__ = ["fault_proxy", "moto_endpoint", "s3_bucket"]

# One intra-op thread: the tiny test models gain nothing from more, and on a shared 2-core
# machine OpenMP threads spinning against other processes make runs tens of times slower.
import torch  # noqa: E402

torch.set_num_threads(1)
