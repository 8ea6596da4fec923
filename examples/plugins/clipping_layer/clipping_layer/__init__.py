"""An example third-party protocol layer: each client clips its update to an L2 norm (``protocols: [clipping, ...]``).

Light modules (:mod:`.config`, :mod:`.specs`) are what ``secure-fed validate`` and ``secure-fed list`` import; the
layer itself (:mod:`.layer`, torch) is imported only when a run builds its stack.
"""
