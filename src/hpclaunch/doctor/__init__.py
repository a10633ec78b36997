"""hpclaunch doctor: the checks before submitting and the doctor's job."""
