;;; magent-store-listing-tests.el --- magent's session picker from one backend call  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; With `magent-store-mode' on, magent's current release (schema 6) lists
;; the store's sessions through its own code (upstream's, from
;; MAGENT_LISP): `magent-session-list-files' and its metadata cache.  The
;; mode asks the backend once for every session and fills that cache up
;; front; what magent then reads must be exactly what magent reads from
;; its own files, and what it reads from the session rendered for it.
;; A real backend over a real EPC socket.

;;; Code:

(require 'cl-lib)
(require 'ert)
(require 'magent-store-resume-tests)

(defvar magent-session-directory)
(defvar magent-session--metadata-cache)
(defvar magent-store-magent--listing-times)
(defvar magent-store-magent--header-timer)

(defun magent-store-listing-test--counting (thunk)
  "Call THUNK; return (VALUE CALLS READS STATS).
CALLS are the backend methods called, READS how many times magent's
own metadata reader ran, STATS how many times a session file's
attributes were read."
  (let ((calls nil) (reads 0) (stats 0))
    (cl-letf* ((attributes (symbol-function 'file-attributes))
               ((symbol-function 'file-attributes)
                (lambda (file &rest args)
                  (when (string-match-p "\\.jsonl?\\'" file) (cl-incf stats))
                  (apply attributes file args)))
               (call (symbol-function 'magent-store-call))
               ((symbol-function 'magent-store-call)
                (lambda (method args) (push method calls)
                  (funcall call method args)))
               (read (symbol-function 'magent-session--read-file-metadata))
               ((symbol-function 'magent-session--read-file-metadata)
                (lambda (file) (cl-incf reads) (funcall read file))))
      (list (funcall thunk) (nreverse calls) reads stats))))

(defun magent-store-listing-test--file (id &optional scope)
  "Return the header file of session ID under SCOPE (global when nil)."
  (expand-file-name (concat id ".json")
                    (magent-session--scope-storage-directory (or scope 'global))))

(defun magent-store-listing-test--rendered-metadata (file)
  "Return magent's metadata of FILE read from the session rendered for it."
  (magent-store-magent--around-read-file-metadata
   (advice--cd*r (symbol-function 'magent-session--read-file-metadata)) file))

(ert-deftest magent-store-listing-asks-the-backend-once-and-magent-reads-what-it-would ()
  "One call lists every session; magent reads each as from its own file."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((project (file-truename (file-name-directory magent-session-directory)))
           (specs `(("20261130-090000-a") ("20261130-090000-b") ("torn")
                    ("20261130-090000-p" . ,project)
                    ;; No title: magent names it by its conversation.
                    ("20261130-090000-u")))
           (own (mapcar (lambda (spec)
                          (let ((session (magent-store-resume-test--new-session
                                          (car spec) (cdr spec))))
                            (when (equal (car spec) "20261130-090000-b")
                              (magent-session-set-metadata-value
                               session 'title "  A title\n on two lines, long enough \
to be cut by magent's own rule  ")
                              (magent-session-save-for-session session 'global))
                            (when (equal (car spec) "20261130-090000-u")
                              (magent-session-set-metadata-value session 'title nil)
                              (magent-session-save-for-session session 'global))
                            (cons (car spec)
                                  (magent-store-resume-test--own-save
                                   session (or (cdr spec) 'global)))))
                        specs))
           (files (mapcar (lambda (spec)
                            (cons (car spec) (magent-store-listing-test--file
                                              (car spec) (cdr spec))))
                          specs)))
      (magent-store-resume-test--restart)
      (write-region "{\"seq\":99,\"type\":\"turn-q" nil
                    (concat (file-name-sans-extension (cdr (assoc "torn" files)))
                            ".jsonl")
                    t 'silent)
      (pcase-let ((`(,listed ,calls ,reads ,stats)
                   (magent-store-listing-test--counting #'magent-session-list-files)))
        (should (equal (sort (copy-sequence listed) #'string<)
                       (sort (mapcar #'cdr files) #'string<)))
        (should (equal calls '("listing")))
        (should (= reads 0))
        ;; Its sort looks every file's metadata and time up at each
        ;; comparison: from the listing, not the disk.
        (should (= stats 0)))
      ;; Again, nothing changed since: the same, from what magent keeps.
      (pcase-let ((`(,listed ,calls ,reads ,stats)
                   (magent-store-listing-test--counting #'magent-session-list-files)))
        (should (= (length listed) (length files)))
        (should (equal calls '("listing")))
        (should (= reads 0))
        (should (= stats 0)))
      (pcase-dolist (`(,id . ,file) files)
        (ert-info ((format "session %s" id))
          (pcase-let ((`(,meta ,calls ,reads)
                       (magent-store-listing-test--counting
                        (lambda () (magent-session--read-file-metadata-cached file)))))
            (should (plist-get meta :valid))
            (should (equal calls nil))
            (should (= reads 0))
            ;; As magent's reader reads the session rendered for it...
            (should (equal meta (magent-store-listing-test--rendered-metadata file)))
            ;; ...and as magent reads its own file of the same session.
            (when (equal id "20261130-090000-u")
              (should-not (plist-get meta :title))
              (should (string-prefix-p "chunk 0" (plist-get meta :summary-title))))
            (if (equal id "torn")
                (should (equal (plist-get meta :summary-title)
                               "[damaged: torn log] Résumé test"))
              (should (equal meta (magent-store-resume-test--own-metadata
                                   (cdr (assoc id own)))))))))
      ;; The sort's times: each file's, as magent's reader of times gives it.
      (let ((magent-store-magent--listing-times (make-hash-table :test #'equal)))
        (magent-store-magent--prefill nil)
        (pcase-dolist (`(,_ . ,file) files)
          (should (equal (gethash file magent-store-magent--listing-times)
                         (let ((magent-store-magent--listing-times nil))
                           (magent-session--file-display-time file))))))
      ;; A scope's listing asks for that scope's folder.
      (pcase-let ((`(,listed ,calls ,reads)
                   (magent-store-listing-test--counting
                    (lambda () (magent-session-list-files-for-scope project)))))
        (should (equal listed (list (cdr (assoc "20261130-090000-p" files)))))
        (should (equal calls '("listing")))
        (should (= reads 0))))))

(ert-deftest magent-store-listing-a-session-saved-since-is-read-again ()
  "A header rewritten after a listing is read anew, as magent's own cache does."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((session (magent-store-resume-test--new-session "20261130-100000-a"))
           (file (magent-store-listing-test--file "20261130-100000-a")))
      (magent-session-list-files)
      (should (equal (plist-get (magent-session--read-file-metadata-cached file)
                                :title)
                     "Résumé test"))
      (sleep-for 0.02)
      (magent-session-set-metadata-value session 'title "Renamed")
      (magent-session-save-for-session session 'global)
      (should (equal (plist-get (magent-session--read-file-metadata-cached file)
                                :title)
                     "Renamed"))
      (should (equal (plist-get
                      (gethash file magent-session--metadata-cache) :metadata)
                     (magent-store-listing-test--rendered-metadata file))))))

(ert-deftest magent-store-listing-shows-a-title-saved-a-moment-ago ()
  "A header magent asked to save later is saved before magent lists sessions."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((session (magent-store-resume-test--new-session "20261130-103000-a"))
           (file (magent-store-listing-test--file "20261130-103000-a")))
      (magent-session-list-files)
      (let ((magent-store-flush-interval 3600))
        (magent-session-set-metadata-value session 'title "Renamed")
        (magent-session-save-deferred-for-session session 'global)
        (should magent-store-magent--header-timer))
      (magent-session-list-files)
      (should-not magent-store-magent--header-timer)
      (should (equal (plist-get (magent-session--read-file-metadata-cached file)
                                :title)
                     "Renamed")))))

(ert-deftest magent-store-listing-looks-each-files-time-up-once ()
  "magent's sort asks a file's time at every comparison: the time of a
session magent saved itself, and of the store's log beside it, is looked
up once per listing."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let ((ids '("20261130-104000-a" "20261130-104000-b" "20261130-104000-c"
                 "20261130-104000-d" "20261130-104000-e"))
          (logs (make-hash-table :test #'equal)))
      (magent-store-mode -1)
      (mapc #'magent-store-resume-test--new-session ids)
      (magent-store-mode 1)
      (cl-letf* ((attributes (symbol-function 'file-attributes))
                 ((symbol-function 'file-attributes)
                  (lambda (file &rest args)
                    (when (string-suffix-p ".jsonl" file)
                      (cl-incf (gethash file logs 0)))
                    (apply attributes file args))))
        (should (= (length (magent-session-list-files)) (length ids))))
      (should (= (hash-table-count logs) (length ids)))
      (maphash (lambda (file n) (ert-info (file) (should (= n 1)))) logs))))

(ert-deftest magent-store-listing-a-backend-without-it-lists-each-session ()
  "A backend that does not know the listing (an older one still running) is no error.
magent lists every session, each read from the session rendered for it."
  (skip-unless (magent-store-test-upstream-available-p))
  (magent-store-resume-test--with-magent
    (let* ((ids '("20261130-110000-a" "20261130-110000-b"))
           (files (mapcar (lambda (id)
                            (magent-store-resume-test--new-session id)
                            (magent-store-listing-test--file id))
                          ids))
           (magent-store-magent--adapter-failures nil))
      (magent-store-resume-test--restart)
      (pcase-let ((`(,listed ,calls ,_ ,_)
                   (cl-letf* ((call (symbol-function 'magent-store-call))
                              ((symbol-function 'magent-store-call)
                               (lambda (method args)
                                 (funcall call (if (equal method "listing")
                                                   "listing-of-a-newer-backend"
                                                 method)
                                          args))))
                     (magent-store-listing-test--counting
                      #'magent-session-list-files))))
        (should (equal (sort (copy-sequence listed) #'string<) files))
        (should (equal calls '("listing" "render" "render"))))
      (should (equal (mapcar #'car (mapcar #'car magent-store-magent--adapter-failures))
                     '("listing the sessions for magent")))
      (dolist (file files)
        (should (equal (magent-session--read-file-metadata-cached file)
                       (magent-store-listing-test--rendered-metadata file)))))))

(provide 'magent-store-listing-tests)
;;; magent-store-listing-tests.el ends here
