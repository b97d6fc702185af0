"""Tests the multi-process flag checks and cluster detection.

The runtime itself is tested end to end in maxtext/bin/multihost_test.py.
"""

import os
from unittest import mock

from absl.testing import absltest

from maxtext.trainers import distributed


class CheckArgsTest(absltest.TestCase):

  def test_no_flags_and_no_cluster_is_single_process(self):
    self.assertFalse(distributed.check_args(None, None, None, cluster=False))
    with mock.patch.dict(os.environ, {}, clear=True):
      self.assertFalse(distributed.initialize())

  def test_no_flags_in_a_cluster_initializes(self):
    self.assertTrue(distributed.check_args(None, None, None, cluster=True))

  def test_all_flags_initialize(self):
    self.assertTrue(distributed.check_args("127.0.0.1:1234", 2, 1,
                                           cluster=False))

  def test_process_id_out_of_range_names_the_values(self):
    with self.assertRaisesRegex(
        ValueError, "--process_id=2 must be less than --num_processes=2"):
      distributed.check_args("127.0.0.1:1234", 2, 2, cluster=False)

  def test_bad_values_are_named(self):
    with self.assertRaisesRegex(ValueError, "--num_processes=0"):
      distributed.check_args("127.0.0.1:1234", 0, 0, cluster=False)
    with self.assertRaisesRegex(ValueError, "--process_id=-1"):
      distributed.check_args("127.0.0.1:1234", 2, -1, cluster=False)
    with self.assertRaisesRegex(ValueError, "'localhost' must be host:port"):
      distributed.check_args("localhost", 2, 0, cluster=False)

  def test_missing_flags_without_a_cluster_are_named(self):
    with self.assertRaisesRegex(
        ValueError, "--num_processes=2 given but --coordinator_address,"
        " --process_id missing"):
      distributed.check_args(None, 2, None, cluster=False)

  def test_cluster_detection(self):
    self.assertFalse(distributed.cluster_detected({}))
    self.assertTrue(distributed.cluster_detected(
        {"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}))
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "n[1-2]",
             "SLURM_NTASKS": "2", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    self.assertTrue(distributed.cluster_detected(slurm))
    self.assertFalse(distributed.cluster_detected({**slurm,
                                                   "SLURM_NTASKS": "1"}))

  def test_a_one_host_tpu_is_no_cluster(self):
    """A TPU VM of one host (what a v5e chip's machine sets) starts no
    runtime; TPU variables naming several hosts are a cluster."""
    one_host = {"TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0",
                "TPU_SKIP_MDS_QUERY": "true",
                "TPU_ACCELERATOR_TYPE": "v5litepod-4"}
    self.assertFalse(distributed.cluster_detected(one_host))
    self.assertFalse(distributed.cluster_detected(
        {"TPU_PROCESS_ADDRESSES": "10.0.0.2:8476"}))
    self.assertTrue(distributed.cluster_detected(
        {**one_host, "TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"}))
    self.assertTrue(distributed.cluster_detected(
        {"TPU_PROCESS_ADDRESSES": "10.0.0.2:8476,10.0.0.3:8476"}))


if __name__ == "__main__":
  absltest.main()
