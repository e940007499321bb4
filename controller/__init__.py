"""The controller process: intake, node-set creation and resizing, preemption, leader lease,
completion and release. The allocator (``controller.allocator``) is a pure function."""
