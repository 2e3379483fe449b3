"""inferhost: the Python side of the stack (the local lab, playbook runs through ansible-runner)."""
