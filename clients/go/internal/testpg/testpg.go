// Package testpg starts a throwaway PostgreSQL cluster for tests: initdb in a temp dir,
// the server on a free loopback port with fsync on, stopped by its pid when the test
// ends. PostgreSQL refuses to run as root, so as root the cluster belongs to nobody.
package testpg

import (
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// bin is the directory of initdb and postgres: PALISADE_PG_BIN, the newest
// /usr/lib/postgresql/N/bin, or the PATH's.
func bin(t *testing.T) string {
	if dir := os.Getenv("PALISADE_PG_BIN"); dir != "" {
		return dir
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/postgres")
	sort.Slice(found, func(i, j int) bool {
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[i]))))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(found[j]))))
		return vi > vj
	})
	if len(found) > 0 {
		return filepath.Dir(found[0])
	}
	if path, err := exec.LookPath("postgres"); err == nil {
		return filepath.Dir(path)
	}
	t.Fatal("PostgreSQL server binaries (initdb, postgres) not found: run scripts/adapter-services")
	return ""
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Start starts a cluster and returns its DSN (user postgres, trust auth, database
// postgres).
func Start(t *testing.T) string {
	t.Helper()
	dir := bin(t)
	root, err := os.MkdirTemp("/tmp", "palisade-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	var credential *syscall.Credential
	if os.Geteuid() == 0 {
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Fatal(err)
		}
		uid, _ := strconv.Atoi(nobody.Uid)
		gid, _ := strconv.Atoi(nobody.Gid)
		credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(root, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	as := func(cmd *exec.Cmd) *exec.Cmd {
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "LC_ALL=C")
		if credential != nil {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: credential}
		}
		return cmd
	}
	data := filepath.Join(root, "data")
	init := as(exec.Command(filepath.Join(dir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"))
	if out, err := init.CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	port := strconv.Itoa(freePort(t))
	log, err := os.Create(filepath.Join(root, "server.log"))
	if err != nil {
		t.Fatal(err)
	}
	server := as(exec.Command(filepath.Join(dir, "postgres"), "-D", data, "-p", port, "-h", "127.0.0.1",
		"-c", "unix_socket_directories=", "-c", "max_connections=100"))
	server.Stdout, server.Stderr = log, log
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = server.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = server.Process.Signal(syscall.SIGINT) // PostgreSQL's fast shutdown
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = server.Process.Kill()
			<-exited
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("postgres exited:\n%s", out)
		default:
		}
		ready := exec.Command(filepath.Join(dir, "pg_isready"), "-h", "127.0.0.1", "-p", port, "-U", "postgres")
		if ready.Run() == nil {
			return "host=127.0.0.1 port=" + port + " user=postgres dbname=postgres sslmode=disable"
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatal("postgres not ready within 60 s")
	return ""
}
