"""The unified namespace the master serves: mount table, paths and the file tree."""
