"""The array-or-tuple helper validates once, with messages naming the value."""
import numpy as np
import pytest

from mnpar._arrays import as_array_list, as_tuple, unwrap


def test_single_array_and_tuple():
    a = np.ones(2)
    assert as_array_list(a) == ([a], False)
    arrays, is_tuple = as_array_list((a, a))
    assert is_tuple and len(arrays) == 2
    arrays, is_tuple = as_array_list([a])
    assert is_tuple and arrays[0] is a
    assert as_array_list(()) == ([], True)


@pytest.mark.parametrize("bad, match", [
    (3.0, "must be an array or a tuple/list of arrays, not float"),
    ("x", "not str"),
    ((np.ones(1), 2), r"data\[1\] must be an array, not int"),
    (np.array(["a"]), "dtype <U1"),
    ((np.ones(1), np.array([None])), r"data\[1\] has dtype object"),
])
def test_bad_data_is_a_type_error_naming_it(bad, match):
    with pytest.raises(TypeError, match=match):
        as_array_list(bad)


def test_as_tuple_and_unwrap():
    assert as_tuple(1) == (1,)
    assert as_tuple([1, 2]) == (1, 2)
    assert as_tuple((1,)) == (1,)
    assert unwrap([1], False) == 1
    assert unwrap([1, 2], True) == (1, 2)
