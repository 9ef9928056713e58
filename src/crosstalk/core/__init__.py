"""Pure CrossTalk logic: no I/O, no asyncio, no clocks read behind the caller's back.

Like h11, this layer takes facts in and returns decisions; ``store``, ``proc`` and the wire
layers feed it. Nothing in here imports from the rest of the package.
"""
