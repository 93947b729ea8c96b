"""One process per state directory (``elasticslice.managers.statedir``): the lock a run, an
``ElasticCluster`` and the manager daemon take, now in the state layer (it lived in the
``manage`` command, and the library imported the command to take it)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from elasticslice.errors import ElasticSliceError
from elasticslice.managers.statedir import StateDirLock, lock_state_dir

HOLD = "import sys; from elasticslice.managers.statedir import lock_state_dir; " \
       "lock_state_dir(sys.argv[1]); print('held', flush=True); sys.stdin.read()"


@pytest.mark.slow  # a holder in a process of its own
def test_a_second_holder_is_refused_naming_the_first_and_a_release_lets_it_in(
        tmp_path: Path) -> None:
    state = tmp_path / "state"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(state)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(ElasticSliceError) as err:
            lock_state_dir(state)
        assert str(err.value) == (f"{state}: another manager (pid {holder.pid}) is running "
                                  f"on this state directory; stop it first")
    finally:
        holder.stdin.close()   # it ends, and its lock goes with it
        holder.wait(30)
    with StateDirLock(state) as lock:
        assert lock.held and (state / "manage.lock").stat().st_mode & 0o777 == 0o600
        assert state.stat().st_mode & 0o777 == 0o700
        with pytest.raises(ElasticSliceError, match="another manager"):
            StateDirLock(state).acquire()
    assert not lock.held
    lock_state_dir(state).release()


def test_a_state_dir_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    plain = tmp_path / "a-file"
    plain.write_text("")
    with pytest.raises(ElasticSliceError, match=f"^{plain / 'state'}: cannot use the state "
                                                f"directory"):
        lock_state_dir(plain / "state")
