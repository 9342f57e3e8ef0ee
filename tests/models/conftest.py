import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def one_intra_op_thread():
    """The model tests run tiny tensors, where intra-op threads only add synchronization (10-50x
    slower per op on a busy 2-core runner); restore the setting afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
