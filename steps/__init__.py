"""The course's steps, one module each; the same names live in steps/."""
