"""What the oracle tests share: a line on the terminal whatever pytest
captures, and the ckpt binary the package runs."""

import os
import shutil

import ckpt_toolkit


def sayer(config):
    """A function printing a line on the terminal whatever pytest captures: what the test
    ran under and what it compared."""
    tr = config.pluginmanager.get_plugin('terminalreporter')
    cm = config.pluginmanager.get_plugin('capturemanager')

    def say(line):
        if tr is None or cm is None:
            print(line)
            return
        with cm.global_and_fixture_disabled():
            tr.ensure_newline()
            tr.write_line(line)
    return say


def ckpt_binary():
    """The ckpt the package runs: $CKPT, else the native folder's, else PATH's."""
    if os.environ.get('CKPT'):
        return os.environ['CKPT']
    native = os.environ.get('CKPT_TOOLKIT_NATIVE') or os.path.join(
        os.path.dirname(ckpt_toolkit.__file__), '_native')
    cand = os.path.join(native, 'bin', 'ckpt')
    return cand if os.path.exists(cand) else (shutil.which('ckpt') or cand)
