//go:build linux

package main

import (
	"syscall"
	"unsafe"
)

// listDir reads a directory with getdents, without a stat or an allocation per entry: the
// subdirectories (by their own type, so symlinks are not followed; .git left out) and whether
// a regular file called name is there. An entry of unknown type is looked at with lstat.
func listDir(dir, name string, buf []byte) ([]string, bool, error) {
	fd, err := syscall.Open(dir, syscall.O_RDONLY|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, false, err
	}
	defer syscall.Close(fd)
	var subdirs []string
	has := false
	for {
		n, err := syscall.Getdents(fd, buf)
		if err != nil {
			return nil, false, err
		}
		if n <= 0 {
			return subdirs, has, nil
		}
		for off := 0; off < n; {
			// struct linux_dirent64 { u64 ino; s64 off; u16 reclen; u8 type; char name[]; }
			reclen := int(*(*uint16)(unsafe.Pointer(&buf[off+16])))
			typ := buf[off+18]
			raw := buf[off+19 : off+reclen]
			off += reclen
			length := 0
			for length < len(raw) && raw[length] != 0 {
				length++
			}
			raw = raw[:length]
			if typ == syscall.DT_UNKNOWN {
				var st syscall.Stat_t
				if syscall.Lstat(dir+"/"+string(raw), &st) != nil {
					continue
				}
				switch st.Mode & syscall.S_IFMT {
				case syscall.S_IFDIR:
					typ = syscall.DT_DIR
				case syscall.S_IFREG:
					typ = syscall.DT_REG
				}
			}
			switch typ {
			case syscall.DT_DIR:
				if entry := string(raw); entry != "." && entry != ".." && entry != ".git" {
					subdirs = append(subdirs, entry)
				}
			case syscall.DT_REG:
				if string(raw) == name {
					has = true
				}
			}
		}
	}
}

// lstatBrief is lstat without os.Lstat's FileInfo: a scan stats every directory and every
// match after every command, and the allocation per stat was a good part of its cost.
func lstatBrief(path string) (briefStat, bool) {
	var st syscall.Stat_t
	if syscall.Lstat(path, &st) != nil {
		return briefStat{}, false
	}
	kind := kindOther
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFDIR:
		kind = kindDir
	case syscall.S_IFREG:
		kind = kindRegular
	}
	return briefStat{kind, st.Size, st.Mtim.Nano()}, true
}
