"""A job's processes, from the launcher: started with torch elastic, watched against the clock and the caps, ended."""
