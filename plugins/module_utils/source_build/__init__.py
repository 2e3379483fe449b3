# Pure Python of the source_build role's modules (source_build_plan, source_build_job, source_build_wait,
# source_patch_set): the plan, the job count, the cache key, the patch set and the build job. No Ansible imports
# here, so the same code runs in modules (shipped by Ansiballz), on the controller and under pytest.
