"""Rule (8) at its boundaries, by hand: a vote fraction exactly alpha keeps the client, and a block
norm exactly tau counts as collaborative."""
import numpy as np
import pytest

from lowrank_fl.clair import collaborative_set, majority_pairs

# K = 5, pairs in eq. (6) order: (0,1) (0,2) (0,3) (0,4) (1,2) (1,3) (1,4) (2,3) (2,4) (3,4)
NEAR, FAR, TAU = 0.0, 2.0, 1.0
NORMS = np.array([NEAR, NEAR, NEAR, NEAR, NEAR, NEAR, NEAR, NEAR, FAR, FAR])
# client 4 is close to 0 and 1 only: 2/4 = 0.5; clients 2, 3: 3/4; clients 0, 1: 4/4


@pytest.mark.parametrize("alpha, benign", [
    (0.5, [True, True, True, True, True]),       # client 4 exactly at alpha: kept
    (0.6, [True, True, True, True, False]),
    (0.75, [True, True, True, True, False]),     # clients 2, 3 exactly at alpha: kept
    (0.8, [True, True, False, False, False]),
])
def test_votes_exactly_at_alpha(alpha, benign):
    b, votes = collaborative_set(NORMS, 5, TAU, alpha)
    np.testing.assert_array_equal(votes, [1.0, 1.0, 0.75, 0.75, 0.5])
    np.testing.assert_array_equal(b, benign)


def test_norm_exactly_at_tau_is_collaborative():
    norms = np.where(NORMS == NEAR, TAU, FAR)        # the near pairs sit exactly at tau
    b, votes = collaborative_set(norms, 5, TAU, 0.5)
    np.testing.assert_array_equal(votes, [1.0, 1.0, 0.75, 0.75, 0.5])
    b2, votes2 = collaborative_set(norms, 5, np.nextafter(TAU, 0.0), 0.5)
    np.testing.assert_array_equal(votes2, np.zeros(5))


@pytest.mark.parametrize("K, alpha, m", [(5, 0.5, 3), (5, 0.75, 4), (6, 0.5, 4), (6, 0.6, 4),
                                          (6, 0.61, 5), (11, 0.5, 6), (2, 0.5, 2)])
def test_majority_pairs_is_the_pairs_of_the_smallest_set(K, alpha, m):
    # the smallest set (8) can keep: m clients with ceil(alpha (K - 1)) <= m - 1 partners each
    assert m - 1 >= alpha * (K - 1) - 1e-12 and m - 2 < alpha * (K - 1) - 1e-12
    assert majority_pairs(K, alpha) == m * (m - 1) // 2
