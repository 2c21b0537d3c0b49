"""Research probes: measurements that explain a result (credit assignment, greedy cycles, MiniHouse's fidelity)."""
