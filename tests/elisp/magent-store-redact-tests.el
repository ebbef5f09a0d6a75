;;; magent-store-redact-tests.el --- ERT: redaction at write time, through a real backend  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A real backend over its real EPC socket, started by the shim.  The
;; fake credentials are put together at run time (none stands whole in
;; this file).  What is checked is every byte of every file under the
;; session root and the backend's state directory.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-test)
(require 'auth-source)

(defun magent-store-redact-test--token ()
  "Return a fake GitHub token, random each time."
  (let ((alnum "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"))
    (concat "gh" "p_" (apply #'string (cl-loop repeat 36 collect
                                               (aref alnum (random (length alnum))))))))

(defun magent-store-redact-test--files-text ()
  "Return every file under the root and the state directory, as one text."
  (let ((state (expand-file-name "magent-store" (getenv "XDG_STATE_HOME"))))
    (with-temp-buffer
      (dolist (dir (list magent-store-root state))
        (when (file-directory-p dir)
          (dolist (file (directory-files-recursively dir "" nil))
            (when (file-regular-p file)
              (let ((coding-system-for-read 'utf-8-unix))
                (insert-file-contents file))))))
      (buffer-string))))

(defun magent-store-redact-test--leaked (secret text)
  "Return the runs of 4 characters of SECRET's random part in TEXT."
  (let (found)
    (dotimes (i (- (length secret) 7))
      (let ((run (substring secret (+ i 4) (+ i 8))))
        (when (string-search run text)
          (push run found))))
    found))

(defun magent-store-redact-test--tick-and-wait (session-id)
  "Send SESSION-ID's queue as a tick and wait (3 s at most) for its reply."
  (let ((session (gethash session-id magent-store--sessions))
        (deadline (+ (float-time) 3)))
    (magent-store--tick session)
    (while (and (magent-store--session-inflight session) (< (float-time) deadline))
      (accept-process-output nil 0.05))
    (should-not (magent-store--session-inflight session))
    session))

(ert-deftest magent-store-redaction-keeps-a-secret-split-across-two-flushes-out-of-every-file ()
  "A token split across two batches is in no file; it loads back as [redacted:github-pat]."
  (magent-store-test--with-backend
    (let ((magent-store-redact '(credentials))
          (token (magent-store-redact-test--token)))
      (magent-store-test--session "s-red")
      (magent-store-append-item-content "s-red" "item-1" (concat "la clé 🔑 " (substring token 0 12)))
      (let ((session (magent-store-redact-test--tick-and-wait "s-red")))
        ;; Its text is partly held back in the backend: Emacs keeps the batch.
        (should (= (length (magent-store--session-held session)) 1))
        (should (= (magent-store--unsaved session) 1))
        (magent-store-append-item-content "s-red" "item-1" (concat (substring token 12) " fin\n"))
        (magent-store-flush "s-red")
        (should-not (magent-store--session-held session)))
      (should (equal (magent-store-test--content (magent-store-load "s-red"))
                     "la clé 🔑 [redacted:github-pat] fin\n"))
      (magent-store-close "s-red")
      (should-not (magent-store-redact-test--leaked
                   token (magent-store-redact-test--files-text))))))

(ert-deftest magent-store-without-redaction-the-text-is-stored-exactly-as-sent ()
  "With `magent-store-redact' nil a token is stored as it was sent, and no batch is held."
  (magent-store-test--with-backend
    (let ((magent-store-redact nil)
          (token (magent-store-redact-test--token)))
      (magent-store-open "s-off")
      (magent-store-test--start-turn "s-off")
      (magent-store-append-item-content "s-off" "item-1" (concat "la clé " (substring token 0 12)))
      (should-not (magent-store--session-held (magent-store-redact-test--tick-and-wait "s-off")))
      (magent-store-append-item-content "s-off" "item-1" (substring token 12))
      (magent-store-flush "s-off")
      (should (equal (magent-store-test--content (magent-store-load "s-off"))
                     (concat "la clé " token))))))

(ert-deftest magent-store-held-batches-are-sent-again-after-the-backend-is-killed ()
  "A batch whose text the killed backend held is resent: nothing lost, nothing twice."
  (magent-store-test--with-backend
    (let ((magent-store-redact t)
          (magent-store-recovering nil)
          (token (magent-store-redact-test--token)))
      (magent-store-test--session "s-kill")
      (magent-store-append-item-content "s-kill" "item-1" "avant ")
      (magent-store-append-item-content "s-kill" "item-1" (substring token 0 20))
      (let ((session (magent-store-redact-test--tick-and-wait "s-kill"))
            (killed magent-store-current-backend))
        (should (magent-store--session-held session))
        (signal-process (magent-store-backend-pid killed) 'SIGKILL)
        ;; Until a new backend has the session open again and its held batch back.
        (let ((deadline (+ (float-time) 10)))
          (while (and (or (eq magent-store-current-backend killed)
                          magent-store-recovering
                          (not (magent-store--session-opened session))
                          (magent-store--session-inflight session))
                      (< (float-time) deadline))
            (sleep-for 0.05)))
        (should (magent-store--session-held session)))
      (magent-store-append-item-content "s-kill" "item-1" (concat (substring token 20) " après\n"))
      (magent-store-flush "s-kill")
      (should (equal (magent-store-test--content (magent-store-load "s-kill"))
                     "avant [redacted:github-pat] après\n"))
      (magent-store-close "s-kill")
      (should-not (magent-store-redact-test--leaked
                   token (magent-store-redact-test--files-text))))))

(ert-deftest magent-store-redaction-takes-auth-source-secrets-and-never-spools ()
  "An auth-source entry's secret is redacted; a large batch goes in the message, not the spool."
  (magent-store-test--with-backend
    (let* ((netrc (make-temp-file "magent-store-netrc-"))
           (secret (concat "s3sam" "e-ouvre-" (number-to-string (random 100000)) "-toi"))
           (auth-sources (list netrc))
           (magent-store-redact '(auth-source))
           (magent-store-redact-auth-sources '((:host "db.example.test")))
           (magent-store-file-threshold 10)
           (spooled 0))
      (unwind-protect
          (progn
            (with-temp-file netrc
              (insert "machine db.example.test login admin password " secret "\n"))
            (when (fboundp 'auth-source-forget-all-cached)
              (auth-source-forget-all-cached))
            (should (equal (magent-store-redact-spec-json)
                           (concat "{\"rules\":false,\"patterns\":{},\"literals\":[\""
                                   secret "\"]}")))
            (advice-add 'magent-store-spool-file :before
                        (lambda (&rest _) (cl-incf spooled))
                        '((name . magent-store-redact-test)))
            (magent-store-open "s-auth")
            (magent-store-test--start-turn "s-auth")
            (magent-store-append-item-content
             "s-auth" "item-1" (concat "psql -W " secret " — fait\n"))
            (magent-store-flush "s-auth")
            (should (= spooled 0))
            (should (equal (magent-store-test--content (magent-store-load "s-auth"))
                           "psql -W [redacted:auth-source] — fait\n"))
            (magent-store-close "s-auth")
            (should-not (string-search secret (magent-store-redact-test--files-text))))
        (advice-remove 'magent-store-spool-file 'magent-store-redact-test)
        (delete-file netrc)))))

;; Four characters is the documented minimum: a secret that long is
;; redacted, a shorter one (it would redact ordinary words) is not taken.
(ert-deftest magent-store-redaction-takes-an-auth-source-secret-of-four-characters ()
  "A 4-character auth-source secret is redacted in every file; a 3-character one is not taken."
  (magent-store-test--with-backend
    (let* ((netrc (make-temp-file "magent-store-netrc-"))
           (four (concat "Q%" "Z!"))
           (three (concat "w%" "K"))
           (auth-sources (list netrc))
           (magent-store-redact '(auth-source))
           (magent-store-redact-auth-sources '((:host "four.example.test")
                                               (:host "three.example.test"))))
      (unwind-protect
          (progn
            (with-temp-file netrc
              (insert "machine four.example.test login a password " four "\n"
                      "machine three.example.test login b password " three "\n"))
            (when (fboundp 'auth-source-forget-all-cached)
              (auth-source-forget-all-cached))
            (should (equal (magent-store-redact-spec-json)
                           (concat "{\"rules\":false,\"patterns\":{},\"literals\":[\""
                                   four "\"]}")))
            (magent-store-open "s-four")
            (magent-store-test--start-turn "s-four")
            (magent-store-append-item-content
             "s-four" "item-1" (concat "code " four " et " three " — fait\n"))
            (magent-store-flush "s-four")
            (should (equal (magent-store-test--content (magent-store-load "s-four"))
                           (concat "code [redacted:auth-source] et " three " — fait\n")))
            (magent-store-close "s-four")
            (should-not (string-search four (magent-store-redact-test--files-text))))
        (delete-file netrc)))))

(ert-deftest magent-store-held-and-in-flight-batches-are-resent-in-order-after-a-restart ()
  "A batch whose text the backend held, then one it never answered, both
go again to the restarted backend, in their order: nothing lost, nothing
twice, the secret split across them still redacted."
  (magent-store-test--with-backend
    (let ((magent-store-redact t)
          (magent-store-recovering nil)
          (token (magent-store-redact-test--token))
          (resent nil))
      (magent-store-test--session "s-order")
      (magent-store-append-item-content "s-order" "item-1" "un ")
      (magent-store-append-item-content "s-order" "item-1" (substring token 0 20))
      (let* ((session (magent-store-redact-test--tick-and-wait "s-order"))
             (killed magent-store-current-backend)
             (pid (magent-store-backend-pid killed)))
        (should (= (length (magent-store--session-held session)) 1))
        ;; Stopped, it reads the next batch never: that one stays in flight.
        (magent-store-test--pause pid)
        (magent-store-append-item-content "s-order" "item-1"
                                          (concat (substring token 20) " deux "))
        (magent-store--tick session)
        (should (= (length (magent-store--session-inflight session)) 1))
        (should (< (car (car (magent-store--session-held session)))
                   (car (car (magent-store--session-inflight session)))))
        (magent-store-append-item-content "s-order" "item-1" "trois")
        (advice-add 'magent-store--send-batch :before
                    (lambda (_session record &rest _) (push (car record) resent))
                    '((name . magent-store-redact-test-resent)))
        (unwind-protect
            (progn
              (signal-process pid 'SIGKILL)
              ;; Until a new backend has the session open again and both batches back.
              (let ((deadline (+ (float-time) 30)))
                (while (and (or (eq magent-store-current-backend killed)
                                magent-store-recovering
                                (not (magent-store--session-opened session))
                                (magent-store--session-inflight session))
                            (< (float-time) deadline))
                  (sleep-for 0.05))))
          (advice-remove 'magent-store--send-batch 'magent-store-redact-test-resent))
        ;; Each once, in their order: none refused for coming first.
        (setq resent (nreverse resent))
        (should (>= (length resent) 2))
        (should (equal resent (sort (delete-dups (copy-sequence resent)) #'<))))
      (magent-store-flush "s-order")
      (should (equal (magent-store-test--content (magent-store-load "s-order"))
                     "un [redacted:github-pat] deux trois"))
      (magent-store-close "s-order")
      (should-not (magent-store-redact-test--leaked
                   token (magent-store-redact-test--files-text))))))

(provide 'magent-store-redact-tests)
;;; magent-store-redact-tests.el ends here
