"""Tools in rollouts: the user's tools, their call formats, asynchronous execution, the sandbox."""
