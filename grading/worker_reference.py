"""attnlib.reference as a graded step's worker sees it: absent (grading/sandbox.py ``worker_lib``
copies this file over the worker's private attnlib/reference.py).

The float64 reference lives in the grader's process, which compares every output with it
(grading/evaluate.py); a step that calls it breaks the rule no_reference and meets this error.
"""


def _absent(name):
    def absent(*args, **kwargs):
        raise RuntimeError(f"attnlib.{name} is not available while a step is graded: the grader compares "
                           "your output with the float64 reference in its own process, so a step must "
                           "compute attention itself")
    absent.__name__ = absent.__qualname__ = name
    return absent


reference_attention = _absent("reference_attention")
reference_backward = _absent("reference_backward")
