"""The controller process: intake, node-set creation and resizing, preemption, leader lease,
completion and release. The allocator (``controller.allocator``) is a pure function.
Installed as ``queueworks.controller`` (kept at the repository's root). It imports the
clients' layers and below, never the workers, the dashboard or the CLI.
"""
