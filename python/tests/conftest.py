"""The tests run under mpiexec, every rank the same tests in the same order (they are collective)."""
import pytest
from mpi4py import MPI


@pytest.fixture
def comm():
    return MPI.COMM_WORLD
