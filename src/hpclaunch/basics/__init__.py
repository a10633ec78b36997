"""Small shared basics every layer uses: the environment, file modes, shell quoting, users,
states, units."""
