"""The Lua scripts of ``queueworks/lua/`` as Python sees them: ``calls`` says, once per
script, what it is called with (keys, arguments, the field names passed in from Python) and
what its reply means (``Call``); ``flow_calls`` the same for the flow-control scripts;
``bound`` loads the scripts and binds each call to a sync or asyncio connection
(``Scripts``). No I/O but the load and the bound call. It imports ``queueworks.protocol``
and the layers below it, never ``transport``, ``task``, ``queue`` or a client.
"""
