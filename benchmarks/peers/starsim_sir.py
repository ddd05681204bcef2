"""Starsim side of the SIR suite (run by bench_peers.py in Starsim's own venv): prints one JSON line.

SIR on a static random network (``ss.RandomNet(n_contacts=10, dynamic=False)``: 5 edges per agent,
mean degree 10), per-contact daily transmission 0.03, infectious periods exponential with mean
10 days (agentsim's sir recovers with probability 0.1 a day: geometric, mean 10), 0.1% infected at
day 0, no deaths, 100 daily steps. ``init_seconds`` builds the people and the network.
"""

import json
import resource
import sys
import time

import starsim as ss

n, seed = int(sys.argv[1]), int(sys.argv[2])
t0 = time.perf_counter()
sim = ss.Sim(n_agents=n, start=0, stop=100, dt=ss.days(1), rand_seed=seed, verbose=0,
             networks=ss.RandomNet(n_contacts=10, dynamic=False),
             diseases=ss.SIR(beta=ss.perday(0.03), init_prev=ss.bernoulli(p=0.001),
                             dur_inf=ss.expon(scale=ss.days(10)), p_death=0))
sim.init()
t1 = time.perf_counter()
sim.run()
t2 = time.perf_counter()
r = sim.results.sir
print(json.dumps({"peer": "starsim", "version": ss.__version__, "agents": n, "init_seconds": t1 - t0,
                  "run_seconds": t2 - t1, "steps": len(r.n_susceptible) - 1,
                  "final_recovered_fraction": float(r.n_recovered[-1]) / n,
                  "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
