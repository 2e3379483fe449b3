"""Apply a patch set (data: name, reason, unified diff) to a git checkout, idempotently.

The state of the work tree is compared as git trees, so the answer is exact and cheap:

* ``expected``: HEAD with every patch applied in order, built in a throw-away index
  (``git apply --cached``), never touching the work tree; a patch that does not apply to the pinned
  source fails here, naming the patch, the file and git's reason ("upstream moved");
* ``actual``: the work tree's tracked files (plus the files the patches create), hashed into a tree
  through a copy of the index;
* ``pristine``: HEAD's own tree.

actual == expected: already applied, nothing to do. actual == pristine: apply the set. Anything else
(an older version of the set, a hand edit): the files that differ are restored from HEAD first and
the set is applied again, and the result reports them, so nothing changes the source silently.
"""

from __future__ import annotations

import os
import re
import tempfile

from .cachekey import normalise_patch

_DIFF_PATH = re.compile(r"^\+\+\+ (\S+)", re.M)
_NEW_FILE = re.compile(r"^--- /dev/null\n\+\+\+ (\S+)", re.M)


class PatchError(Exception):
    """A patch does not apply to the source at the pinned commit, or git failed."""


def _strip(path, strip):
    return "/".join(path.split("/")[strip:])


def touched_paths(diff, strip=1):
    """Files a unified diff writes, relative to the repository, after dropping ``strip`` leading components."""
    return [_strip(path, strip) for path in _DIFF_PATH.findall(diff) if path != "/dev/null"]


def created_paths(diff, strip=1):
    """Files a unified diff creates (``--- /dev/null``)."""
    return [_strip(path, strip) for path in _NEW_FILE.findall(diff)]


class Repo:
    """git in one work tree; ``run(argv, cwd, env, data)`` returns (rc, stdout, stderr)."""

    def __init__(self, path, run, git="git"):
        self.path = path
        self.run = run
        self.git = git

    def call(self, *args, env=None, data=None, check=True):
        rc, out, err = self.run([self.git, *args], self.path, env, data)
        if check and rc != 0:
            raise PatchError(f"git {' '.join(args)} failed in {self.path}: {(err or out).strip()}")
        return rc, out, err

    def head(self):
        return self.call("rev-parse", "HEAD")[1].strip()

    def pristine_tree(self):
        return self.call("rev-parse", "HEAD^{tree}")[1].strip()

    def _scratch_index(self):
        handle, path = tempfile.mkstemp(prefix="inferhost-index-")
        os.close(handle)
        os.unlink(path)
        return path

    def expected_tree(self, patches, strip=1):
        """Tree of HEAD with the patches applied, or PatchError naming the first one that does not apply."""
        index = self._scratch_index()
        env = {"GIT_INDEX_FILE": index}
        try:
            self.call("read-tree", "HEAD", env=env)
            for patch in patches:
                rc, out, err = self.call(
                    "apply", "--cached", f"-p{strip}", "--whitespace=nowarn", "-",
                    env=env, data=normalise_patch(patch["diff"]), check=False,
                )  # fmt: skip
                if rc != 0:
                    raise PatchError(
                        f"patch {patch['name']!r} does not apply to {self.path} at {self.head()}: "
                        f"{(err or out).strip()}. The upstream lines it expects have moved or changed: "
                        "update the patch to the pinned ref, or pin the ref the patch was written for."
                    )
            return self.call("write-tree", env=env)[1].strip()
        finally:
            if os.path.exists(index):
                os.unlink(index)

    def worktree_tree(self, extra_paths=()):
        """Tree of the work tree's tracked files plus ``extra_paths`` (those that exist).

        The scratch index is read from HEAD, so it has no stat data and ``git add -u`` hashes every tracked
        file: a copy of the real index would trust its stat cache, and a same-size edit within the same
        second (a patch changing 41 to 42) would look unchanged.
        """
        index = self._scratch_index()
        env = {"GIT_INDEX_FILE": index}
        try:
            self.call("read-tree", "HEAD", env=env)
            self.call("add", "-u", env=env)
            present = [p for p in extra_paths if os.path.lexists(os.path.join(self.path, p))]
            if present:
                self.call("add", "-f", "--", *present, env=env)
            return self.call("write-tree", env=env)[1].strip()
        finally:
            if os.path.exists(index):
                os.unlink(index)

    def changed_between(self, tree_a, tree_b):
        out = self.call("diff", "--name-only", "--no-renames", tree_a, tree_b)[1]
        return [line for line in out.splitlines() if line]

    def restore(self, paths, created):
        """Put ``paths`` back as HEAD has them; remove the ones HEAD does not have (created by a patch)."""
        tracked = set()
        if paths:
            tracked = set(self.call("ls-tree", "-r", "--name-only", "HEAD", "--", *paths)[1].splitlines())
        if tracked:
            self.call("checkout", "HEAD", "--", *sorted(tracked))
        for path in paths:
            if path not in tracked and path in created:
                full = os.path.join(self.path, path)
                if os.path.lexists(full):
                    os.unlink(full)

    def apply(self, patches, strip=1):
        for patch in patches:
            rc, out, err = self.call(
                "apply", f"-p{strip}", "--whitespace=nowarn", "-", data=normalise_patch(patch["diff"]), check=False
            )
            if rc != 0:
                detail = (err or out).strip()
                raise PatchError(f"patch {patch['name']!r} failed on the work tree of {self.path}: {detail}")


def reconcile(repo, patches, strip=1, check_mode=False):
    """Bring the work tree to HEAD + patches. Returns the result dict of the module (changed, state, ...)."""
    created = [p for patch in patches for p in created_paths(patch["diff"], strip)]
    touched = sorted({p for patch in patches for p in touched_paths(patch["diff"], strip)})
    commit = repo.head()
    pristine = repo.pristine_tree()
    expected = repo.expected_tree(patches, strip) if patches else pristine
    actual = repo.worktree_tree(created)
    result = {
        "commit": commit,
        "patches": [p["name"] for p in patches],
        "files": touched,
        "reverted": [],
        "expected_tree": expected,
    }
    if actual == expected:
        return dict(result, changed=False, state="applied" if patches else "pristine")
    stray = [] if actual == pristine else repo.changed_between(pristine, actual)
    unexpected = sorted(set(stray) - set(touched)) if stray else []
    result["reverted"] = stray
    result["unexpected"] = unexpected
    if check_mode:
        return dict(result, changed=True, state="would-apply")
    if stray:
        repo.restore(stray, created)
    repo.apply(patches, strip)
    after = repo.worktree_tree(created)
    if after != expected:
        left = repo.changed_between(expected, after)
        raise PatchError(f"after applying the patch set, {', '.join(left)} still differ from the expected result")
    return dict(result, changed=True, state="applied")
