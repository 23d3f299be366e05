"""ferry: collective programs (the DSL in ferry.dsl, plans and their verifier in ferry.plan)."""
