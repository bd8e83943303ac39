"""The course's autograder: fair points, hidden tests, Gradescope, and a grader a submission cannot fool.

    python -m grading [--impl steps|solutions|PATH] [--step N]   grade one submission, print the table
    python -m grading batch DIR -j N                             grade a class: CSV gradebook
    python -m grading autograder                                 build the Gradescope autograder zip
    python -m grading release --out DIR                          build the student release

Modules: ``config`` (config.toml, hidden overlay), ``spec`` (the per-step table:
group kinds, rules, items), ``worker`` (the only process that runs student
code), ``sandbox`` (starts it with limits, reads back only plain tensors),
``evaluate`` (every comparison, in the grader), ``grade`` (one submission),
``report`` (table, results.json, JUnit), ``batch``, ``package``.
See grading/README.md.
"""
