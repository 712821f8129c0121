"""What confines every process that runs team code: Landlock, seccomp, namespaces, its own root, the scratch folders."""
