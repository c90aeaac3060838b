"""Tools for testing applications and the SDK itself: nothing here is needed in production.

``sdk.testing.simulation`` runs a group of SDS participants on a simulated lossy network
with a manual clock (the seeded simulation the tests, the benchmarks and
``examples/demo.py --simulated`` use). ``sdk.testing.waiting`` is how tests wait
for what they check instead of sleeping a fixed time (``eventually``, ``idle``).
"""
