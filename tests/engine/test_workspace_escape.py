"""Workspace tools against a member that plants symlinks: nothing outside the workdir is ever read,
written, sized, searched or listed, and bad paths are tool errors, never crashes."""
import os
import shutil
import stat
import threading

import pytest

from veronica.agent.loop import run_tool
from veronica.agent.tools import ToolContext, tools_for
from veronica.agent.tools import safe_fs
from veronica.agent.tools import workspace as ws
from veronica.agent.tools.base import ToolError
from veronica.engine import supervisor

HOST_TEXT = "HOST-SECRET " * 600 + "\n"  # 7201 bytes: a size no workspace file has


@pytest.fixture
def root(space, tmp_path):
    root = tmp_path / "alpha"
    (root / "src").mkdir()
    (root / "src" / "a.py").write_text("x = 1  # TODO fix\n")
    return root


@pytest.fixture
def host(tmp_path):
    """A host file and directory outside the workdir (never a real system file)."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "host.txt").write_text(HOST_TEXT)
    return outside


@pytest.fixture
def ctx(space, root):
    return ToolContext(member=supervisor.get_member(space, "w1"), space=space)


def untouched(host) -> bool:
    return sorted(os.listdir(host)) == ["host.txt"] and (host / "host.txt").read_text() == HOST_TEXT


# --- the reported attack: a planted `<name>.veronica-tmp` symlink --------------------------------

@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_a_planted_temp_symlink_does_not_redirect_a_write(ctx, root, host, tool):
    (root / "report.txt").write_text("draft\n")
    os.symlink(host / "host.txt", root / "report.txt.veronica-tmp")
    if tool == "write_file":
        ws.write_file(ctx, {"path": "report.txt", "content": "pwned\n"})
    else:
        ws.edit_file(ctx, {"path": "report.txt", "old": "draft", "new": "pwned"})
    assert untouched(host)
    assert not (root / "report.txt").is_symlink() and (root / "report.txt").read_text() == "pwned\n"


def test_the_attack_as_a_member_runs_it(ctx, root, host):
    out = ws.run_command(ctx, {"command": f"ln -sf {host}/host.txt report.txt.veronica-tmp && echo planted"})
    assert "planted" in out
    assert ws.write_file(ctx, {"path": "report.txt", "content": "pwned"}) == "wrote 5 characters to report.txt"
    assert untouched(host) and (root / "report.txt").read_text() == "pwned"
    assert not [n for n in os.listdir(root) if n.startswith(".veronica-")]  # no temporary left behind


def test_a_symlink_planted_at_the_target_between_check_and_write_is_replaced_not_followed(ctx, root, host, monkeypatch):
    real = safe_fs.secrets.token_hex

    def plant_then_name(n):  # runs after the path was checked, right before the temporary is made
        os.symlink(host / "host.txt", root / "report.txt")
        return real(n)

    monkeypatch.setattr(safe_fs.secrets, "token_hex", plant_then_name)
    ws.write_file(ctx, {"path": "report.txt", "content": "mine"})
    assert untouched(host)
    assert not (root / "report.txt").is_symlink() and (root / "report.txt").read_text() == "mine"


# --- symlinked directories and races on a directory component ---------------------------------

def test_a_symlinked_parent_directory_is_refused(ctx, root, host):
    os.symlink(host, root / "out")
    for call in (lambda: ws.write_file(ctx, {"path": "out/new.txt", "content": "x"}),
                 lambda: ws.write_file(ctx, {"path": "out/deeper/new.txt", "content": "x"}),
                 lambda: ws.read_file(ctx, {"path": "out/host.txt"}),
                 lambda: ws.edit_file(ctx, {"path": "out/host.txt", "old": "HOST", "new": "x"}),
                 lambda: ws.list_dir(ctx, {"path": "out"}),
                 lambda: ws.grep(ctx, {"pattern": "HOST", "path": "out"})):
        with pytest.raises(ToolError, match="outside the workspace"):
            call()
    assert untouched(host)


def test_a_directory_swapped_for_a_symlink_mid_walk_is_not_followed(ctx, root, host, monkeypatch):
    """The member swaps `d/e` for a symlink to the host just after the tool opened `d`: the tool
    holds `d` itself, so it writes into the real (moved) directory, never the host's."""
    (root / "d" / "e").mkdir(parents=True)
    (host / "e").mkdir()
    real_open, swapped = os.open, []

    def swap_on_open(path, flags, mode=0o777, *, dir_fd=None):
        if path == "e" and dir_fd is not None and not swapped:
            os.rename(root / "d", root / "d.moved")
            os.symlink(host, root / "d")
            swapped.append(True)
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", swap_on_open)
    ws.write_file(ctx, {"path": "d/e/f.txt", "content": "inside"})
    monkeypatch.undo()
    assert swapped, "the tool opened no path component relative to its parent's descriptor"
    assert sorted(os.listdir(host)) == ["e", "host.txt"] and os.listdir(host / "e") == []
    assert (root / "d.moved" / "e" / "f.txt").read_text() == "inside"


def test_a_racing_member_flipping_a_directory_and_a_symlink_never_gets_a_write_out(ctx, root, host):
    (root / "d").mkdir()
    d, real, link = root / "d", root / "d.real", root / "d.link"
    stop = threading.Event()

    def flip():  # the member's loop: `d` is a real directory, then a symlink to the host, and back
        while not stop.is_set():
            try:
                if real.exists():  # a tool made `d` anew while it was missing: put the real one back
                    d.unlink() if d.is_symlink() else shutil.rmtree(d, ignore_errors=True)
                    real.rename(d)
                d.rename(real)
                os.symlink(host, link)
                link.rename(d)
                d.unlink()
                real.rename(d)
            except OSError:
                continue

    flipper = threading.Thread(target=flip)
    flipper.start()
    write = tools_for("worker")["write_file"]
    try:  # a refusal while the symlink is in place is the right answer; a crash or a host file is not
        results = [run_tool(write, ctx, {"path": f"d/f{i}.txt", "content": "x"}) for i in range(400)]
    finally:
        stop.set()
        flipper.join()
    escaped = sorted(set(os.listdir(host)) - {"host.txt"})
    assert (escaped, [r for r in results if "unexpectedly" in r]) == ([], [])


# --- reads, listings and searches never follow a link out ---------------------------------------

def test_symlinks_to_outside_are_never_followed_by_read_tools(ctx, root, host):
    os.symlink(host / "host.txt", root / "leak.txt")
    os.symlink(host, root / "leakdir")
    os.symlink("../../outside/host.txt", root / "src" / "rel.txt")
    for raw in ("leak.txt", "leakdir/host.txt", "src/rel.txt"):
        with pytest.raises(ToolError, match="outside the workspace"):
            ws.read_file(ctx, {"path": raw})
    listing = ws.list_dir(ctx, {})
    assert "7201" not in listing and "HOST" not in listing
    assert f"leak.txt -> {host}/host.txt (symlink)" in listing.splitlines()
    assert "7201" not in ws.list_dir(ctx, {"path": "src"})
    assert "HOST" not in ws.grep(ctx, {"pattern": "HOST"})
    assert ws.grep(ctx, {"pattern": "HOST", "path": "src"}) == "(no matches)"
    with pytest.raises(ToolError, match="outside the workspace"):
        ws.grep(ctx, {"pattern": "HOST", "path": "leak.txt"})
    assert "host.txt" not in ws.glob_files(ctx, {"pattern": "*"})
    assert ws.glob_files(ctx, {"pattern": "*host*"}) == "(no files match)"


def test_a_dangling_symlink_does_not_break_list_dir(ctx, root):
    os.symlink("gone.txt", root / "dangling")
    os.symlink("/nonexistent/elsewhere", root / "far")
    listing = ws.list_dir(ctx, {}).splitlines()
    assert listing == ["src/", "dangling -> gone.txt (symlink)", "far -> /nonexistent/elsewhere (symlink)"]
    assert "src/a.py" in ws.glob_files(ctx, {"pattern": "**"}) and ws.grep(ctx, {"pattern": "TODO"}).startswith("src/a.py")


def test_a_fifo_is_not_a_file_and_does_not_hang_a_read(ctx, root):
    os.mkfifo(root / "pipe")
    with pytest.raises(ToolError, match="'pipe' is not a file"):
        ws.read_file(ctx, {"path": "pipe"})
    assert ws.grep(ctx, {"pattern": "x"}).startswith("src/a.py")
    assert "pipe (not a regular file)" in ws.list_dir(ctx, {})


# --- symlinks that stay inside are followed, by us, component by component --------------------
# Decision: a link that leads to another place in the workdir is followed (repositories carry such
# links); it is resolved with readlink relative to a held descriptor, never by the kernel, and
# walks (grep, glob) skip links so each real file is reported once under its real path.

def test_symlinks_inside_the_workspace_are_followed_inside(ctx, root):
    os.symlink("src/a.py", root / "alias.py")
    os.symlink("src", root / "lib")
    os.symlink("/workspace/src/a.py", root / "sandbox_alias.py")  # as `ln -s` inside run_command makes it
    assert "1  x = 1" in ws.read_file(ctx, {"path": "alias.py"})
    assert "1  x = 1" in ws.read_file(ctx, {"path": "lib/a.py"})
    assert "1  x = 1" in ws.read_file(ctx, {"path": "sandbox_alias.py"})
    assert "1  x = 1" in ws.read_file(ctx, {"path": "lib/../src/./a.py"})
    assert ws.grep(ctx, {"pattern": "TODO"}) == "src/a.py:1: x = 1  # TODO fix"  # links are not walked twice
    assert ws.grep(ctx, {"pattern": "TODO", "path": "lib"}) == "src/a.py:1: x = 1  # TODO fix"
    assert ws.glob_files(ctx, {"pattern": "*.py"}) == "src/a.py"
    assert ws.write_file(ctx, {"path": "alias.py", "content": "x = 2\n"}) == "wrote 6 characters to src/a.py"
    assert (root / "alias.py").is_symlink() and (root / "src" / "a.py").read_text() == "x = 2\n"
    assert "a.py (6 bytes)" in ws.list_dir(ctx, {"path": "lib"})


def test_symlink_loops_are_a_tool_error(ctx, root):
    os.symlink("loop", root / "loop")
    os.symlink("b", root / "a")
    os.symlink("a", root / "b")
    for raw in ("loop", "a/x", "b"):
        with pytest.raises(ToolError, match="more than 40 symbolic links"):
            ws.read_file(ctx, {"path": raw})


# --- bad names: tool errors naming the path and the limit --------------------------------------

@pytest.mark.parametrize("raw", ["a\x00b.txt", "src/\x00", "\x00", "src/a.py\x00.txt"])
def test_nul_bytes_in_a_path_are_a_tool_error(ctx, raw):
    for call in (lambda: ws.read_file(ctx, {"path": raw}), lambda: ws.write_file(ctx, {"path": raw, "content": "x"}),
                 lambda: ws.edit_file(ctx, {"path": raw, "old": "x", "new": "y"}), lambda: ws.list_dir(ctx, {"path": raw}),
                 lambda: ws.grep(ctx, {"pattern": "x", "path": raw})):
        with pytest.raises(ToolError, match=r"contains a NUL byte; paths cannot contain NUL"):
            call()


def test_over_long_names_and_paths_are_a_tool_error(ctx, root):
    with pytest.raises(ToolError, match="has a name of 256 bytes; the limit is 255 bytes per name"):
        ws.write_file(ctx, {"path": "n" * 256, "content": "x"})
    with pytest.raises(ToolError, match="has a name of 300 bytes; the limit is 255 bytes per name"):
        ws.read_file(ctx, {"path": "src/" + "é" * 150})
    with pytest.raises(ToolError, match="is 6000 bytes; the limit is 4096 bytes"):
        ws.write_file(ctx, {"path": "ab/" * 2000, "content": "x"})
    assert ws.write_file(ctx, {"path": "n" * 255, "content": "x"}) == f"wrote 1 characters to {'n' * 255}"
    assert sorted(os.listdir(root)) == ["n" * 255, "src"]
    with pytest.raises(ToolError, match="is more than 128 directories deep"):
        ws.write_file(ctx, {"path": "d/" * 130 + "f.txt", "content": "x"})


def test_text_that_is_not_utf8_is_a_tool_error(ctx):
    with pytest.raises(ToolError, match="not valid UTF-8"):
        ws.read_file(ctx, {"path": "bad\ud800.txt"})
    with pytest.raises(ToolError, match="content is not valid UTF-8 text"):
        ws.write_file(ctx, {"path": "ok.txt", "content": "bad\ud800"})


@pytest.mark.parametrize("raw", ["..", "../outside/host.txt", "src/../../outside/host.txt", "src/../..", "/etc/passwd",
                                 "/workspace/../outside/host.txt", "./../outside/host.txt"])
def test_path_traversal_is_refused_for_every_file_tool(ctx, host, raw):
    for call in (lambda: ws.read_file(ctx, {"path": raw}), lambda: ws.write_file(ctx, {"path": raw, "content": "x"}),
                 lambda: ws.edit_file(ctx, {"path": raw, "old": "HOST", "new": "x"}), lambda: ws.list_dir(ctx, {"path": raw}),
                 lambda: ws.grep(ctx, {"pattern": "HOST", "path": raw})):
        with pytest.raises(ToolError, match="outside the workspace"):
            call()
    assert untouched(host)


def test_a_refused_write_makes_no_directories(ctx, root):
    for raw in ("new/../../x.txt", "new/deeper/../../../x.txt", "src/a.py/x.txt", "d/" * 130 + "f.txt"):
        with pytest.raises(ToolError):
            ws.write_file(ctx, {"path": raw, "content": "x"})
    assert sorted(os.listdir(root)) == ["src"] and os.listdir(root / "src") == ["a.py"]
    with pytest.raises(ToolError, match="'new/../made.txt': there is no directory 'new'"):  # as open(2) would say
        ws.write_file(ctx, {"path": "new/../made.txt", "content": "x"})
    assert ws.write_file(ctx, {"path": "src/../made.txt", "content": "x"}) == "wrote 1 characters to made.txt"


def test_written_files_and_directories_get_sane_permissions(ctx, root):
    old = os.umask(0o022)
    try:
        ws.write_file(ctx, {"path": "new/deep/file.txt", "content": "x"})
        (root / "run.sh").write_text("echo\n")
        os.chmod(root / "run.sh", 0o4777)
        ws.edit_file(ctx, {"path": "run.sh", "old": "echo", "new": "echo hi"})
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(root / "new" / "deep" / "file.txt").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(root / "new" / "deep").st_mode) == 0o755
    assert stat.S_IMODE(os.stat(root / "run.sh").st_mode) == 0o775  # kept executable; setuid and o+w dropped


def test_file_contents_with_nul_bytes_come_back_without_nul(ctx, root):
    (root / "blob.bin").write_bytes(b"head\x00tail\xff\n")
    assert ws.read_file(ctx, {"path": "blob.bin"}) == "   1  head\ufffdtail\ufffd"
    assert ws.grep(ctx, {"pattern": "tail"}) == "blob.bin:1: head\ufffdtail\ufffd"


# --- the attacker's battery ---------------------------------------------------------------------

def battery(host) -> list[tuple[str, list[tuple[str, dict]]]]:
    """Escape attempts: (label, calls). Each is run on a fresh plant of links (see plant())."""
    h = f"{host}/host.txt"
    writes = [("write_file", {"path": p, "content": "pwned"}) for p in (
        "out_file", "abs_link", "rel_link", "chain", "out_dir/new.txt", "out_dir/host.txt", "sub/up/host.txt",
        "../outside/new.txt", h, f"{host}/new.txt", "/workspace/../outside/new.txt", "dangling_out",
        "sub/up/new/x.txt", "loop", "src/../../outside/new.txt", "sub/new.txt", "rootpfx", "procroot", "sub/up",
        "out_dir/", "src/a.py/../../outside/new.txt", "sibling")]
    edits = [("edit_file", {"path": p, "old": "HOST", "new": "pwned"}) for p in (
        "out_file", "abs_link", "rel_link", "chain", "out_dir/host.txt", "sub/up/host.txt", h, "../outside/host.txt")]
    reads = [("read_file", {"path": p}) for p in (
        "out_file", "abs_link", "rel_link", "chain", "out_dir/host.txt", "sub/up/host.txt", h, "../outside/host.txt",
        "/workspace/../outside/host.txt", "sub/../../outside/host.txt", "rootpfx", "procroot", "/proc/self/root" + h,
        "//" + h, "sibling")]
    lists = [("list_dir", {"path": p}) for p in (".", "out_dir", "sub", "sub/up", "..", str(host), "abs_dir", "peek", "/")]
    greps = [("grep", {"pattern": "HOST", "path": p}) for p in (".", "out_file", "out_dir", "sub", "sub/up", "chain",
                                                                  "..", h)]
    globs = [("glob", {"pattern": p}) for p in ("**", "*host*", "../*", "**/host.txt", "out_dir/*", "*")]
    attempts = [(f"{tool} {args}", [(tool, args)]) for tool, args in writes + edits + reads + lists + greps + globs]
    for target in ("report.txt", "src/a.py"):  # the reported attack, planted by a member's command
        attempts.append((f"planted tmp for {target}", [
            ("run_command", {"command": f"ln -sf {h} {target}.veronica-tmp"}),
            ("write_file", {"path": target, "content": "pwned"})]))
        attempts.append((f"planted tmp for edit of {target}", [
            ("run_command", {"command": f"echo draft > {target}; ln -sf {h} {target}.veronica-tmp"}),
            ("edit_file", {"path": target, "old": "draft", "new": "pwned"})]))
    attempts.append(("a dir replaced by a link to the host, then written", [
        ("run_command", {"command": f"rm -rf src && ln -s {host} src"}), ("write_file", {"path": "src/new.txt", "content": "x"}),
        ("edit_file", {"path": "src/host.txt", "old": "HOST", "new": "x"}), ("read_file", {"path": "src/host.txt"})]))
    return attempts


def plant(root, host) -> None:
    links = {"out_file": f"{host}/host.txt", "abs_link": f"{host}/host.txt", "rel_link": "../outside/host.txt",
             "chain": "chain2", "chain2": "out_file", "out_dir": str(host), "abs_dir": str(host), "loop": "loop",
             "dangling_out": f"{host}/new-file.txt", "sub/up": "../../outside", "peek/size_leak": f"{host}/host.txt",
             "rootpfx": f"{root}/../outside/host.txt", "procroot": f"/proc/self/root{host}/host.txt",
             "sub/new.txt.veronica-tmp": f"{host}/host.txt", "sibling": f"{root}2/host.txt"}
    if not os.path.lexists(f"{root}2"):  # a neighbour whose name starts with the workdir's (another space's)
        os.symlink(host, f"{root}2")
    (root / "sub").mkdir(exist_ok=True)
    (root / "peek").mkdir(exist_ok=True)
    for name, target in links.items():
        if not os.path.lexists(root / name):
            os.symlink(target, root / name)


def test_the_attackers_battery_gets_nothing_out(ctx, root, host):
    tools = tools_for("leader")
    attempts = battery(host)
    escaped, crashed = [], []
    for label, calls in attempts:
        plant(root, host)
        results = [run_tool(tools[name], ctx, args) for name, args in calls]
        if not untouched(host) or any("HOST-SECRET" in r or "7201" in r for r in results):
            escaped.append(label)
            for entry in os.listdir(host):  # restore the host side for the next attempt
                if entry != "host.txt":
                    os.remove(host / entry) if not (host / entry).is_dir() else os.rmdir(host / entry)
            (host / "host.txt").write_text(HOST_TEXT)
        crashed += [label for r in results if "failed unexpectedly" in r]
    assert len(attempts) >= 50
    assert not escaped and not crashed, f"{len(attempts)} tried, {len(escaped)} escaped: {escaped}; crashed: {crashed}"


def test_a_run_that_reads_a_binary_file_stores_its_tool_turn(space, root, scripted):
    from veronica.swarm import bus
    from veronica.engine import runner
    from veronica.models import Turn

    (root / "blob.bin").write_bytes(b"\x00\x01ELF\x00\xff")
    scripted(("read_file", {"path": "blob.bin"}), ("list_dir", {}), "read it")
    bus.send(space, "boss", "w1", "read blob.bin")
    assert runner.wake(supervisor.get_member(space, "w1").pk, "message") == "done"
    tool_turns = list(Turn.objects.filter(role="tool").order_by("seq").values_list("content", flat=True))
    assert tool_turns[0] == "   1  \ufffd\x01ELF\ufffd\ufffd" and "blob.bin (7 bytes)" in tool_turns[1]


def test_run_command_output_that_is_not_text_comes_back_without_nul(ctx):
    assert ws.run_command(ctx, {"command": r"printf 'a\000b\377c'; printf 'e\000' >&2"}) == "exit 0\na\ufffdb\ufffdc\n[stderr]\ne\ufffd"
