//! arfsnic: a multiqueue NIC emulator with RSS and an aRFS filter table.
