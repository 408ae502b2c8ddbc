import numpy as np
import pytest
from opcheck import check_op

rng = np.random.default_rng(0)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((1, 4), (3, 1))])
def test_binary(op, shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32) + 3
    check_op(op, [a, b])
