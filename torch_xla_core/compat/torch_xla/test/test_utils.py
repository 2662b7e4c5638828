"""torch_xla.test.test_utils: mp_test, a unittest method run in a process of
its own (its exit status is the result)."""
import functools
import multiprocessing
import unittest


def mp_test(func):
    """Runs the decorated test method in a child process; the test passes
    when the child exits with status 0."""
    @functools.wraps(func)
    def run(*args, **kwargs):
        p = multiprocessing.Process(target=func, args=args, kwargs=kwargs)
        p.start()
        p.join()
        if args and isinstance(args[0], unittest.TestCase):
            args[0].assertEqual(p.exitcode, 0)
        return p.exitcode
    return run
