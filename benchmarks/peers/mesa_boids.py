"""Mesa side of the boids suite (run by bench_peers.py in Mesa's own venv): prints one JSON line.

Mesa's own ``boid_flockers`` example at Mesa's density (100 boids per 100 x 100): ``n`` boids in a
``sqrt(n / 0.01)`` square torus, its default rules (vision 10, separation 2, cohere 0.03,
separate 0.015, match 0.05, speed 1); seconds per step, median of the timed steps.
"""

import json
import math
import resource
import statistics
import sys
import time

import mesa
from mesa.examples.basic.boid_flockers.model import BoidFlockers, BoidsScenario

n, steps, seed = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
side = math.sqrt(n / 0.01)
model = BoidFlockers(BoidsScenario(population_size=n, width=side, height=side, rng=seed))
times = []
for _ in range(steps):
    t = time.perf_counter()
    model.step()
    times.append(time.perf_counter() - t)
print(json.dumps({"peer": "mesa", "version": mesa.__version__, "agents": n,
                  "seconds_per_step": statistics.median(times), "steps": steps,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
