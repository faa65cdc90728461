"""When a run's hardware counts as saturated: the two device figures the levers' verdict and the execution rules share.

"The hardware is saturated" is said only when every lever was predicted and none pays, the engine was stepping
at least :data:`ENGINE_BUSY` of the window, and its decode step spent at least :data:`FAR_FROM_ROOF` of its time
at its roofline floor (below that the steps are held by software, not by the hardware).
"""

from __future__ import annotations

# Share of the measurement window the engine must be stepping to count as busy (no idle time left).
ENGINE_BUSY = 0.9
# Share of a decode step at its roofline floor below which the step is "far from the roof".
FAR_FROM_ROOF = 0.3
