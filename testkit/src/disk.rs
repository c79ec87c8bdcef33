//! A small disk of its own for one test node: an ext4 image on a loop
//! device, mounted where the test says, that the test can fill (ENOSPC)
//! and slow down (a blkio cgroup throttling the node's writes to it).
//!
//! Needs root, `mkfs.ext4` and loop devices; the slow disk needs cgroup
//! v1's blkio controller at `/sys/fs/cgroup/blkio` (this kernel has no
//! `dm-delay`). Dropped, it moves the node out of its cgroup, removes it,
//! and unmounts the disk.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

/// Where cgroup v1's blkio hierarchy is.
const BLKIO: &str = "/sys/fs/cgroup/blkio";

/// Disks made by this process (part of their cgroups' names).
static MADE: AtomicU32 = AtomicU32::new(0);

/// A mounted loop-device ext4 filesystem.
#[derive(Debug)]
pub struct Disk {
    image: PathBuf,
    mount: PathBuf,
    /// The loop device's `major:minor`.
    device: String,
    filler: PathBuf,
    cgroup: PathBuf,
}

use crate::run_command as run;

impl Disk {
    /// A `mib` MiB ext4 filesystem in an image under `dir`, mounted at
    /// `mount` (created).
    pub fn new(dir: &Path, mount: &Path, mib: u64) -> io::Result<Disk> {
        let image = dir.join(format!(
            "{}.img",
            mount.file_name().unwrap_or_default().to_string_lossy()
        ));
        fs::File::create(&image)?.set_len(mib << 20)?;
        let img = image.to_string_lossy().to_string();
        run("mkfs.ext4", &["-q", "-F", &img])?;
        fs::create_dir_all(mount)?;
        let mnt = mount.to_string_lossy().to_string();
        run("mount", &["-o", "loop", &img, &mnt])?;
        let source = run("findmnt", &["-n", "-o", "MAJ:MIN", &mnt])?;
        let k = MADE.fetch_add(1, Ordering::Relaxed);
        Ok(Disk {
            image,
            mount: mount.to_path_buf(),
            device: source.trim().to_string(),
            filler: mount.join("filler"),
            cgroup: Path::new(BLKIO).join(format!("wf{}x{k}", std::process::id())),
        })
    }

    /// Where it is mounted.
    pub fn mount(&self) -> &Path {
        &self.mount
    }

    /// Bytes free on it now.
    pub fn free(&self) -> u64 {
        let path = std::ffi::CString::new(self.mount.to_string_lossy().as_bytes()).unwrap();
        // SAFETY: statvfs writes into the zeroed struct we own.
        unsafe {
            let mut st: libc::statvfs = std::mem::zeroed();
            assert_eq!(libc::statvfs(path.as_ptr(), &mut st), 0, "statvfs");
            st.f_bavail * st.f_frsize
        }
    }

    /// Fills it but for `leave` bytes (a file allocated with fallocate).
    pub fn fill(&self, leave: u64) {
        let take = self.free().saturating_sub(leave) + self.filler_len();
        let f = fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&self.filler)
            .expect("the filler file");
        use std::os::fd::AsRawFd;
        // SAFETY: a plain fallocate on a file we opened.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, take as libc::off_t) };
        assert_eq!(r, 0, "fallocate: {}", io::Error::last_os_error());
    }

    fn filler_len(&self) -> u64 {
        fs::metadata(&self.filler).map_or(0, |m| m.len())
    }

    /// Frees what [`Disk::fill`] took.
    pub fn unfill(&self) {
        let _ = fs::remove_file(&self.filler);
    }

    /// Throttles process `pid`'s writes to this disk to `iops` per second
    /// (it joins a blkio cgroup of its own).
    pub fn throttle(&self, pid: u32, iops: u32) -> io::Result<()> {
        fs::create_dir_all(&self.cgroup)?;
        fs::write(
            self.cgroup.join("blkio.throttle.write_iops_device"),
            format!("{} {iops}", self.device),
        )?;
        fs::write(self.cgroup.join("cgroup.procs"), pid.to_string())
    }

    /// Lifts the throttle (the process stays in the cgroup).
    pub fn unthrottle(&self) -> io::Result<()> {
        fs::write(
            self.cgroup.join("blkio.throttle.write_iops_device"),
            format!("{} 0", self.device),
        )
    }

    /// Write requests to this disk the cgroup's processes issued (the
    /// proof the throttle applied to them).
    pub fn throttled_writes(&self) -> u64 {
        let stats =
            fs::read_to_string(self.cgroup.join("blkio.throttle.io_serviced")).unwrap_or_default();
        stats
            .lines()
            .filter(|l| l.starts_with(&format!("{} Write", self.device)))
            .filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok())
            .sum()
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        if self.cgroup.exists() {
            if let Ok(procs) = fs::read_to_string(self.cgroup.join("cgroup.procs")) {
                for pid in procs.lines() {
                    let _ = fs::write(Path::new(BLKIO).join("cgroup.procs"), pid);
                }
            }
            let _ = fs::remove_dir(&self.cgroup);
        }
        let mnt = self.mount.to_string_lossy().to_string();
        let _ = run("umount", &["-l", &mnt]);
        let _ = fs::remove_file(&self.image);
    }
}
