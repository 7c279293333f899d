"""Ray Tune's ``ray.tune.utils`` names that scripts import: :mod:`ftnb.utils.mock_trainable`."""
