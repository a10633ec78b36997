"""What the user asked for, typed: the options registry, the layers, cluster profiles
(clusters/*.toml), project and user files, the JobSpec type."""
